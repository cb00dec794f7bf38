// A batch of greedy requests through the serving engine (BatchEngine: the one decode loop, with or without a
// drafter), timed over the stretch where every sequence decodes: what `kiln bench decode --draft-profile` compares,
// plain against drafted.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine_api.h"
#include "kiln/drafter.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"

namespace kiln::cli {

struct EngineDecodeRun {
  std::vector<std::vector<int32_t>> outputs;  // per prompt: the generated tokens
  // The window: from the moment the last sequence received its first token (every prompt is in) to the moment
  // the first one finished (the batch is still whole), and the tokens emitted in between.
  double window_seconds = 0;
  int64_t window_tokens = 0;
  double tok_s = 0;
  double seconds = 0;  // submit → last token
  EngineMetrics metrics;
};

// Starts an engine over `model` with the recipe's [scheduler] settings (a fresh cache pool; prefix caching off, so
// every run computes the same prompts the same way), submits every prompt greedy with `max_tokens` and no stop
// tokens, and waits for all. With `drafter`, decoding sequences verify up to `depth` of its drafts per step.
Result<EngineDecodeRun> run_engine_decode(const LoadedModel& model, const Recipe& recipe,
                                          const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
                                          std::shared_ptr<Drafter> drafter = nullptr, int64_t depth = 0);

}  // namespace kiln::cli
