// `kiln bench decode --draft-profile p1,..,pK`: what drafting gains through the whole system against the ideal the
// measured verification cost allows, on any model (dummy weights included), with the oracle drafter
// (oracle_drafter.h) accepting along a fixed per-position profile. Per (context, batch):
//   pass 1  plain greedy decoding through the engine: the recording, and plain tok/s;
//   pass 2  (bench_model.h, run before) the runner's decode step and its verification pass of 1 + K rows;
//   pass 3  drafted decoding through the engine with the oracle: drafted tok/s, acceptance per position.
// The engine keeps each verification pass inside the runner's batch-invariance bound (engine/draft_depth.h), so
// with many sequences it drafts shallower than K, or not at all: each point reports the depth it ran at.
// ideal speedup = tokens per verification pass (measured) × t(decode step) ÷ t(verification pass of 1 + K rows):
// what drafting would give if proposing cost nothing and the engine added nothing to a step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_model.h"

namespace kiln::cli {

struct DraftedPoint {
  int64_t context = 0, batch = 0;
  std::string skipped;  // why it did not run; empty when it did
  int64_t tokens_per_sequence = 0;
  double plain_tok_s = 0, drafted_tok_s = 0, speedup = 0;  // engine, over the window where the batch is whole
  double tokens_per_pass = 0, expected_tokens_per_pass = 0;  // mean acceptance length: measured, the profile's
  // The depth the passes ran at: drafts per verification pass, below K where the runner's batch-invariance bound
  // (model/batch_invariance.h) shrank it, 0 where it left no room for drafts at all; and the steps it limited. The
  // ideal below is against a pass of 1 + K rows, so it is only comparable at the full depth.
  double effective_depth = 0;
  int64_t bound_limited_steps = 0;
  std::vector<double> conditional_rates;  // per position: P(draft i accepted | drafts before it accepted)
  std::vector<double> cumulative_rates;   // per position: P(draft i accepted), as the engine's metrics count it
  double decode_ms = 0, verify_ms = 0;    // pass 2: the runner's step and its 1 + K row verification pass
  // The same through the engine (from the tok/s): where measured / ideal falls short, which of the two grew.
  double engine_decode_ms = 0, engine_pass_ms = 0;
  double ideal_speedup = 0, fraction_of_ideal = 0;
  // Lossless checks: drafted output against the recording (tokens that differ, sequences with any), rows the
  // engine reported that left the recording, passes that accepted another length than the oracle's decisions.
  int64_t mismatched_tokens = 0, mismatched_sequences = 0, divergent_rows = 0, unexpected_accepts = 0;
  int64_t passes = 0;
  bool lossless() const { return mismatched_tokens == 0 && divergent_rows == 0 && unexpected_accepts == 0; }
};

// Parses "0.9,0.8,0.7": 1..16 values in [0, 1]; an error message, or "" with `out` filled.
std::string parse_draft_profile(const std::string& text, std::vector<double>& out);

// Prompts of `context` tokens, one per sequence, each different from the others.
std::vector<std::vector<int32_t>> bench_prompts(int64_t batch, int64_t context, int64_t vocab);

// Passes 1 and 3 for every (context, batch) of `options`, `options.steps` tokens per sequence, with `verify`
// (pass 2's points: rows 1 and 1 + K at each pair) giving the ideal. The engines run over the target's pool, which
// open_bench_target must have made with lookahead_slots ≥ K (the command asks for 2K, as the engine reserves).
Result<std::vector<DraftedPoint>> run_drafted_bench(BenchTarget& target, const DecodeBenchOptions& options,
                                                    const std::vector<double>& profile,
                                                    const std::vector<DecodePoint>& verify);

std::string drafted_table(const std::vector<DraftedPoint>& points, const std::vector<double>& profile);
nlohmann::json drafted_json(const std::vector<DraftedPoint>& points, const std::vector<double>& profile);

}  // namespace kiln::cli
