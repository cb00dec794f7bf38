#include "bench_drafted.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "engine_decode_run.h"
#include "kiln/log.h"
#include "oracle_drafter.h"

namespace kiln::cli {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string joined(const std::vector<double>& v, const char* f) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : " ") + fmt(f, x);
  return s;
}

// Pass 2's point at (context, batch, rows), or null.
const DecodePoint* find_point(const std::vector<DecodePoint>& points, int64_t context, int64_t batch, int64_t rows) {
  for (const DecodePoint& p : points)
    if (p.context == context && p.batch == batch && p.rows == rows) return &p;
  return nullptr;
}

}  // namespace

std::string parse_draft_profile(const std::string& text, std::vector<double>& out) {
  out.clear();
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !(v >= 0 && v <= 1))
      return "--draft-profile `" + text + "`: every value must be a number in [0, 1] (the probability that draft i is "
             "accepted given that the drafts before it were)";
    out.push_back(v);
  }
  if (out.empty() || out.size() > 16) return "--draft-profile `" + text + "`: give 1 to 16 values, one per draft position";
  return "";
}

std::vector<std::vector<int32_t>> bench_prompts(int64_t batch, int64_t context, int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>(context));
  // Spread over the vocabulary like the decode sweep's tokens; sequence b starts at its own offset.
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < context; ++i)
      prompts[b][i] = static_cast<int32_t>(((i + 1) * 7919 + b * 104729 + 13) % vocab);
  return prompts;
}

Result<std::vector<DraftedPoint>> run_drafted_bench(BenchTarget& t, const DecodeBenchOptions& o,
                                                    const std::vector<double>& profile,
                                                    const std::vector<DecodePoint>& verify) {
  const int64_t k = static_cast<int64_t>(profile.size());
  const int64_t vocab = t.model.model->vocab_size();
  // The engine runs share the target's pool (pass 2's pages hold no sequence the engine knows of).
  if (t.plan.config.lookahead_slots < k)
    return failed_precondition("the benchmark's pool reserves " + std::to_string(t.plan.config.lookahead_slots) +
                               " positions past a step, fewer than K = " + std::to_string(k) +
                               " (open_bench_target's lookahead_slots)");
  EngineBench bench{t.plan, t.caches};
  const BatchInvariance bound = t.model.model->batch_invariance();
  // The same tokens are timed in both runs: past the warm-up, short of the last K (see DecodeWindow).
  const DecodeWindow window{o.warmup, k};
  std::vector<DraftedPoint> points;
  for (int64_t context : o.contexts)
    for (int64_t batch : o.batches) {
      DraftedPoint p;
      p.context = context;
      p.batch = batch;
      p.tokens_per_sequence = o.steps;
      p.expected_tokens_per_pass = expected_tokens_per_pass(profile);
      const DecodePoint* decode = find_point(verify, context, batch, 1);
      const DecodePoint* pass = find_point(verify, context, batch, 1 + k);
      if (!decode || !pass || !decode->skipped.empty() || !pass->skipped.empty()) {
        p.skipped = decode && !decode->skipped.empty() ? decode->skipped
                    : pass && !pass->skipped.empty()   ? pass->skipped
                                                       : "no verification-pass timing";
        points.push_back(p);
        continue;
      }
      p.decode_ms = decode->ms_per_step;
      p.verify_ms = pass->ms_per_step;
      const auto prompts = bench_prompts(batch, context, vocab);
      const std::string where = "context " + std::to_string(context) + ", batch " + std::to_string(batch);
      log::info("draft profile, {}: pass 1 (plain decode, recording)", where);
      KILN_ASSIGN_OR_RETURN(EngineDecodeRun plain, run_engine_decode(t.model, bench, prompts, o.steps, window));
      std::vector<std::vector<int32_t>> recordings = prompts;
      for (int64_t b = 0; b < batch; ++b)
        recordings[b].insert(recordings[b].end(), plain.outputs[b].begin(), plain.outputs[b].end());
      auto oracle = std::make_shared<OracleDrafter>(profile, std::move(recordings), vocab);
      log::info("draft profile, {}: pass 3 (drafted decode, oracle K = {})", where, k);
      KILN_ASSIGN_OR_RETURN(EngineDecodeRun drafted, run_engine_decode(t.model, bench, prompts, o.steps, window, oracle, k));

      p.plain_tok_s = plain.tok_s;
      p.drafted_tok_s = drafted.tok_s;
      p.speedup = plain.tok_s > 0 ? drafted.tok_s / plain.tok_s : 0;
      const EngineMetrics& m = drafted.metrics;
      p.tokens_per_pass = m.spec_drafts ? 1.0 + static_cast<double>(m.spec_accepted_tokens) / m.spec_drafts : 1.0;
      for (size_t i = 0; i < m.spec_drafted_per_pos.size(); ++i)
        p.cumulative_rates.push_back(m.spec_drafted_per_pos[i]
                                         ? static_cast<double>(m.spec_accepted_per_pos[i]) / m.spec_drafted_per_pos[i]
                                         : 0.0);
      const OracleStats& s = oracle->stats();
      for (size_t i = 0; i < profile.size(); ++i) p.conditional_rates.push_back(s.conditional_rate(i));
      p.passes = m.spec_drafts;
      p.effective_depth = m.spec_drafts ? static_cast<double>(m.spec_draft_tokens) / m.spec_drafts : 0.0;
      p.bound_limited_steps = m.spec_bound_limited_steps;
      p.divergent_rows = s.divergent_rows;
      p.unexpected_accepts = s.unexpected_accepts;
      for (int64_t b = 0; b < batch; ++b) {
        const auto& a = plain.outputs[b];
        const auto& d = drafted.outputs[b];
        int64_t differ = static_cast<int64_t>(std::max(a.size(), d.size()) - std::min(a.size(), d.size()));
        for (size_t i = 0; i < std::min(a.size(), d.size()); ++i) differ += a[i] != d[i];
        p.mismatched_tokens += differ;
        p.mismatched_sequences += differ > 0;
      }
      if (p.plain_tok_s > 0) p.engine_decode_ms = 1e3 * batch / p.plain_tok_s;
      if (p.drafted_tok_s > 0) p.engine_pass_ms = 1e3 * batch * p.tokens_per_pass / p.drafted_tok_s;
      p.ideal_speedup = p.verify_ms > 0 ? p.tokens_per_pass * p.decode_ms / p.verify_ms : 0;
      p.fraction_of_ideal = p.ideal_speedup > 0 ? p.speedup / p.ideal_speedup : 0;
      if (!p.lossless())
        log::error("draft profile, {}: NOT LOSSLESS — {} of {} sequences differ from plain decoding ({} tokens), {} "
                   "rows left the recording, {} passes accepted another length than the drafts' correctness implies; "
                   "the drafted run's acceptance no longer follows the profile",
                   where, p.mismatched_sequences, batch, p.mismatched_tokens, p.divergent_rows, p.unexpected_accepts);
      if (p.bound_limited_steps > 0)
        log::warn("draft profile, {}: the runner's batch-invariance bound ({} rows, {} with logits) limited drafting "
                  "in {} steps: the passes ran at depth {:.2f} of K = {}, and the ideal (a 1 + K row pass) does not "
                  "apply",
                  where, bound.rows, bound.logit_rows, p.bound_limited_steps, p.effective_depth, k);
      log::info("draft profile, {}: plain {:.1f} tok/s, drafted {:.1f} tok/s ({:.2f}x; ideal {:.2f}x); a step "
                "{:.3f} ms in the engine vs {:.3f} ms alone, a pass {:.3f} ms vs {:.3f} ms",
                where, p.plain_tok_s, p.drafted_tok_s, p.speedup, p.ideal_speedup, p.engine_decode_ms, p.decode_ms,
                p.engine_pass_ms, p.verify_ms);
      points.push_back(p);
    }
  return points;
}

std::string drafted_table(const std::vector<DraftedPoint>& points, const std::vector<double>& profile) {
  std::string s =
      "\nDrafting with the oracle, profile " + joined(profile, "%.2f") + " (K = " + std::to_string(profile.size()) +
      "; p_i = P(draft i accepted | drafts before it accepted)); tok/s through the engine while the whole batch "
      "decodes; depth run = drafts per verification pass (below K where the runner's batch-invariance bound kept "
      "the passes shallower, 0 where it left no room to draft); ideal = tokens per pass x decode ms / verify ms\n\n"
      "| context | batch | plain tok/s | drafted tok/s | speedup | depth run | tokens/pass (profile) | per-position "
      "acceptance (conditional) | decode ms | verify ms (1+K rows) | ideal speedup | measured / ideal | lossless |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const DraftedPoint& p : points) {
    s += "| " + std::to_string(p.context) + " | " + std::to_string(p.batch) + " | ";
    if (!p.skipped.empty()) {
      s += "skipped: " + p.skipped + " | | | | | | | | | | |\n";
      continue;
    }
    // Below K where the batch-invariance bound shrank the passes (then the ideal, against 1 + K rows, does not apply).
    const std::string depth = p.bound_limited_steps > 0 ? fmt("%.2f", p.effective_depth) + " (bound-limited)"
                                                        : fmt("%.2f", p.effective_depth);
    s += fmt("%.1f", p.plain_tok_s) + " | " + fmt("%.1f", p.drafted_tok_s) + " | " + fmt("%.2fx", p.speedup) + " | " +
         depth + " | " + fmt("%.2f", p.tokens_per_pass) + fmt(" (%.2f)", p.expected_tokens_per_pass) + " | " +
         joined(p.conditional_rates, "%.2f") + " | " + fmt("%.3f", p.decode_ms) + " | " + fmt("%.3f", p.verify_ms) +
         " | " + fmt("%.2fx", p.ideal_speedup) + " | " + fmt("%.1f %%", 100 * p.fraction_of_ideal) + " | ";
    s += p.lossless() ? "yes" : "NO: " + std::to_string(p.mismatched_tokens) + " tokens in " +
                                    std::to_string(p.mismatched_sequences) + " sequences differ, " +
                                    std::to_string(p.divergent_rows) + " rows off the recording";
    s += " |\n";
  }
  return s;
}

nlohmann::json drafted_json(const std::vector<DraftedPoint>& points, const std::vector<double>& profile) {
  nlohmann::json rows = nlohmann::json::array();
  for (const DraftedPoint& p : points) {
    nlohmann::json r = {{"context", p.context}, {"batch", p.batch}};
    if (!p.skipped.empty()) {
      r["skipped"] = p.skipped;
    } else {
      r.update({{"tokens_per_sequence", p.tokens_per_sequence},
                {"plain_tok_s", p.plain_tok_s},
                {"drafted_tok_s", p.drafted_tok_s},
                {"speedup", p.speedup},
                {"verification_passes", p.passes},
                {"effective_depth", p.effective_depth},
                {"bound_limited_steps", p.bound_limited_steps},
                {"tokens_per_pass", p.tokens_per_pass},
                {"expected_tokens_per_pass", p.expected_tokens_per_pass},
                {"conditional_acceptance_per_position", p.conditional_rates},
                {"acceptance_per_position", p.cumulative_rates},
                {"decode_ms_per_step", p.decode_ms},
                {"verify_ms_per_pass", p.verify_ms},
                {"engine_decode_ms_per_step", p.engine_decode_ms},
                {"engine_ms_per_pass", p.engine_pass_ms},
                {"ideal_speedup", p.ideal_speedup},
                {"fraction_of_ideal", p.fraction_of_ideal},
                {"lossless", p.lossless()},
                {"mismatched_tokens", p.mismatched_tokens},
                {"mismatched_sequences", p.mismatched_sequences},
                {"divergent_rows", p.divergent_rows},
                {"unexpected_accepts", p.unexpected_accepts}});
    }
    rows.push_back(r);
  }
  return {{"profile", profile}, {"depth", profile.size()}, {"points", rows}};
}

}  // namespace kiln::cli
