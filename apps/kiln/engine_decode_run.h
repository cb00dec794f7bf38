// A batch of greedy requests through the serving engine (BatchEngine: the one decode loop, with or without a
// drafter), timed over the stretch where every sequence decodes: what `kiln bench decode --draft-profile` compares,
// plain against drafted.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cache_manager.h"
#include "engine/engine_api.h"
#include "engine/engine_factory.h"
#include "kiln/drafter.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"

namespace kiln::cli {

// The engine settings and the cache pool that successive runs share: the same pool (and step shapes) each time,
// so a CUDA graph captured by one run is replayed by the next instead of captured again.
struct EngineBench {
  EnginePlan plan;
  std::shared_ptr<CacheManager> caches;
};

// The recipe's [scheduler] settings over a fresh pool, prefix caching off (every run computes the same prompts the
// same way) and `max_depth` positions reserved for the drafts of a verification pass.
Result<EngineBench> make_engine_bench(const LoadedModel& model, const Recipe& recipe, int64_t max_depth);

// Which tokens are timed: every sequence's tokens from its index `skip_tokens` (every prompt is in, and the steps
// that capture CUDA graphs of new shapes are behind) to its index (count − 1 − `tail_tokens`) (the batch is still
// whole; with drafting depth K as the tail, every pass in the window verifies K drafts: the engine drafts fewer
// near max_tokens).
struct DecodeWindow {
  int64_t skip_tokens = 0;
  int64_t tail_tokens = 0;
};

struct EngineDecodeRun {
  std::vector<std::vector<int32_t>> outputs;  // per prompt: the generated tokens
  // The window: from the moment the last sequence reached its first timed token to the moment the first one
  // reached its last, and the tokens emitted in between (by any sequence).
  double window_seconds = 0;
  int64_t window_tokens = 0;
  double tok_s = 0;
  double seconds = 0;  // submit → last token
  EngineMetrics metrics;
};

// Starts an engine over `model` and `bench`'s pool, submits every prompt greedy with `max_tokens` and no stop
// tokens, and waits for all. With `drafter`, decoding sequences verify up to `depth` (≤ make_engine_bench's
// max_depth) of its drafts per step.
Result<EngineDecodeRun> run_engine_decode(const LoadedModel& model, EngineBench& bench,
                                          const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
                                          const DecodeWindow& window = {}, std::shared_ptr<Drafter> drafter = nullptr,
                                          int64_t depth = 0);

}  // namespace kiln::cli
