// `kiln bench decode|prefill`: a recipe's model timed directly through its ModelRunner — no server, no scheduler —
// at given context lengths, batch sizes and prompt lengths, beside the rooflines of model/model_cost.h. What runs is
// what the engine runs: one ModelRunner::step per step, greedy token selection on the device (verification of the
// rows as drafts where rows > 1), token ids copied back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cache_manager.h"
#include "engine/engine_factory.h"
#include "engine/kv_capacity.h"
#include "engine/model_runner.h"
#include "model/model_config.h"
#include "model/model_cost.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"

namespace kiln::cli {

// The shapes a sweep needs the KV pool and the step buffers to hold.
struct BenchShape {
  int64_t sequences = 1;    // at once
  int64_t positions = 1;    // per sequence
  int64_t step_tokens = 1;  // in one forward
};

// A recipe's model and a runner over a KV pool the engine factory sized for `BenchShape` (as much of
// sequences × positions as memory allows; at least one sequence).
struct BenchTarget {
  LoadedModel model;  // declared first: outlives the pool and the runner
  Recipe recipe;      // as loaded, with [scheduler] sized for the shape
  EnginePlan plan;    // the engine settings and pool that recipe gets here: `caches` is that pool
  const ModelConfig* config = nullptr;  // the MLA + MoE family's (the cost model's shapes)
  std::shared_ptr<CacheManager> caches;
  std::unique_ptr<ModelRunner> runner;
  KvCapacity capacity;
  std::string device;  // "NVIDIA H200 (139.8 GiB)", "CPU (1 thread)"
  double weight_gib = 0;
  WeightPricing pricing;      // bytes per weight of the decode roofline (recipe_weight_pricing)
  std::string pricing_basis;  // what they are, in words
};


// Loads `recipe_file` with `sets` (section.key=value overrides), refuses shapes past the model's
// max_position_embeddings, and builds the runner. `cuda_graphs`: replay decode steps from CUDA graphs (CUDA only).
// Before loading, prints the memory model of the recipe sized for `shape` (memory_screen_gate.h) and refuses a
// no-go unless `ignore_screen`. `lookahead_slots` > 0: the pool reserves that many positions past each engine step
// and keeps no prefix cache, so an engine can also run drafting over it (bench_drafted.h): the device memory of a
// pool lives as long as the model, so the target's one pool serves every pass.
Result<BenchTarget> open_bench_target(const std::string& recipe_file, const std::vector<std::string>& sets,
                                      const BenchShape& shape, bool cuda_graphs, bool ignore_screen,
                                      int64_t lookahead_slots = 0);

struct DecodeBenchOptions {
  std::vector<int64_t> contexts = {4096, 32768, 131072};
  std::vector<int64_t> batches = {1, 4, 16, 64};
  // Query rows per sequence per step: 1 = decode; 1 + K = a speculative verification pass of K drafts (every
  // row's logits), the step the target runs per drafting round.
  std::vector<int64_t> rows = {1};
  bool profile = false;        // CUDA: per-stage GPU time of the timed steps (launched directly, no graphs)
  int64_t steps = 64;          // timed
  int64_t warmup = 4;          // untimed, before them (the first ones capture CUDA graphs and size buffers)
  // bytes/s of the roofline; 0: measure_copy_bandwidth on the target's device before the points run
  double bandwidth = 0;
};

// The target's memory bandwidth as the roofline counts it: a copy's bytes read plus written, over a 64–128 MiB copy
// repeated (past the GPU's L2; on the CPU split over the recipe's threads). Returns 0 when it cannot measure (no
// memory for the buffers); `how` says what was measured.
double measure_copy_bandwidth(const BenchTarget& target, std::string& how);

// Positions one sequence of a decode point needs: the context, then warm-up and timed steps (and the verification
// rows past the last one).
int64_t decode_positions(int64_t context, const DecodeBenchOptions& options);

struct DecodePoint {
  int64_t context = 0, batch = 0, rows = 1;
  std::string skipped;  // why it did not run; empty when it did
  double seconds = 0;   // the timed steps
  double tok_s = 0, ms_per_step = 0;
  double weight_bytes = 0, kv_bytes = 0;  // read per step (model_cost.h)
  double roofline_tok_s = 0;
  std::vector<std::pair<std::string, double>> stages;  // with profile: ms per step by stage
};

// Every (context, batch) pair: `batch` sequences, each on its own pages, decode one token per step at positions
// context, context + 1, ... The pages before the context hold whatever the pool holds (their values do not
// change the work). Pairs whose pages do not fit the pool are skipped with the reason.
Result<std::vector<DecodePoint>> run_decode_bench(BenchTarget& target, const DecodeBenchOptions& options);

struct PrefillBenchOptions {
  std::vector<int64_t> lengths = {4096, 32768, 131072};
  int64_t chunk = 8192;      // tokens per forward, as the scheduler splits a long prompt
  double peak_tflops = 790;  // dense bf16 rate (cuBLAS) measured on the H200 here
  bool profile = false;      // after each timed prompt, the same prompt again with the stage timer on
};

struct PrefillPoint {
  int64_t length = 0, chunks = 0;
  double seconds = 0, tok_s = 0;
  double flops = 0, tflops = 0;  // model FLOPs (model_cost.h) and their rate
  std::vector<std::pair<std::string, double>> stages;  // with profile: ms per prompt by stage (all chunks)
};

// Each length: one prompt from position 0 in chunks of `chunk` tokens, one forward per chunk with start_position
// advancing (logits of each chunk's last token only), timed end to end after one untimed chunk. The target's pool
// must hold the longest length (open_bench_target with positions ≥ it guarantees that).
Result<std::vector<PrefillPoint>> run_prefill_bench(BenchTarget& target, const PrefillBenchOptions& options);

// Markdown tables (header + rows) and JSON records of the points.
std::string decode_table(const std::vector<DecodePoint>& points);
// With profile: one table per point, the step's stages with ms per step and their share.
std::string stage_tables(const std::vector<DecodePoint>& points);
std::string prefill_table(const std::vector<PrefillPoint>& points, const PrefillBenchOptions& options);
// With profile: one table per prompt length, its stages with ms per prompt and their share.
std::string stage_tables(const std::vector<PrefillPoint>& points);
nlohmann::json decode_json(const std::vector<DecodePoint>& points, const DecodeBenchOptions& options);
nlohmann::json prefill_json(const std::vector<PrefillPoint>& points, const PrefillBenchOptions& options);

}  // namespace kiln::cli
