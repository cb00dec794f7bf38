// The serving engine's limits: the [scheduler] recipe section resolved against the model, plus the KV pool.
#pragma once

#include <cstdint>

#include "kiln/recipe.h"
#include "kiln/status.h"

namespace kiln {

struct EngineConfig {
  int64_t max_model_len = 0;              // prompt + output tokens of one sequence
  int64_t max_num_seqs = 16;              // sequences running (holding KV) at once
  int64_t max_num_batched_tokens = 2048;  // tokens computed per step: decodes + prefill chunks
  int64_t max_waiting = 1024;             // queued requests beyond which submit answers kResourceExhausted
  // Keep every step inside the model runner's batch-invariance bound, prompt chunks included (model/batch_invariance.h):
  // a sequence's output then depends only on its own tokens. The engine applies the bound when it starts
  // (max_num_batched_tokens and max_chunk_tokens lowered to it); a runner without a bound is invariant already.
  bool batch_invariant = false;
  int64_t max_chunk_tokens = 0;  // prompt tokens a sequence may bring to one step (0: no limit beyond the step's)
  // A prompt alone in the engine (no other sequence running or waiting) may bring up to this many tokens to one step
  // instead of max_num_batched_tokens (0 or less than it: no difference). Such a step computes nothing per chunk again:
  // on CUDA it runs layer by layer in tiles (model/batch_invariance.h's kCudaPrefillTileRows), expanding each cached
  // key once a layer instead of once a chunk, in one tile's buffers. A request arriving meanwhile waits for the step.
  int64_t lone_prompt_tokens = 0;
  bool prefix_caching = true;
  int64_t lookahead_slots = 0;  // extra KV positions reserved per running sequence (speculative decoding)
  int64_t speculative_depth = 0;  // draft tokens per decode step (K); needs a drafter and lookahead_slots ≥ K
  // Draft only in steps where at most this many sequences decode (0: always). Above it a verification pass of
  // 1 + K rows per sequence costs more than the drafts save (measured: C16 on the H200, bench/RESULTS.md), and
  // plain decoding is what drafting reproduces anyway.
  int64_t speculative_max_batch = 0;
  int64_t num_blocks = 0;       // the KV pool
  int64_t block_size = 0;

  // Every limit positive, and one step able to hold a decode of every running sequence.
  Status validate() const;
};

// Reads [scheduler] (max_model_len 0 = `model_max_len`, the model's max_position_embeddings; a recipe value
// above it is refused). The pool fields are left for the caller, who sizes the pool (kv_capacity.h).
Result<EngineConfig> engine_config_from_recipe(const RecipeSection& scheduler, int64_t model_max_len);

}  // namespace kiln
