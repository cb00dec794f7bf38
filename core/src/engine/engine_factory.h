// From a loaded model and its recipe to a running engine: the [scheduler] limits, the drafter and what it needs
// (the target's next-n layers, its own cache layers), the cache pool sized from the memory the weights leave
// (kv_capacity.h) and made by the CacheManager, the capacity report logged, the runner and the engine loop started.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/batch_engine.h"
#include "engine/cache_manager.h"
#include "engine/engine_draft_services.h"
#include "engine/kv_capacity.h"
#include "engine/memory_model.h"
#include "kiln/drafter.h"
#include "kiln/modality.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"

namespace kiln {

struct EngineMemory {
  bool cpu = true;               // CPU: the pool is also capped at max_num_seqs × max_model_len tokens
  uint64_t memory_bytes = 0;     // device memory; 0 on the CPU = physical RAM
  uint64_t weight_bytes = 0;     // 0 = the checkpoint's file sizes
  uint64_t workspace_bytes = 0;  // 0 = an estimate of the largest step's activations (see engine_factory.cpp)
};

struct StartedEngine {
  // Destroyed in reverse: the engine (which calls the drafter and holds the runner) first, then the drafter, then
  // the services it borrowed, then the cache pool.
  std::shared_ptr<CacheManager> caches;
  std::unique_ptr<EngineDraftServices> draft_services;
  std::shared_ptr<Drafter> drafter;
  std::shared_ptr<Modality> modality;  // media.modality on the model's device: the server encodes media parts with it
  std::unique_ptr<BatchEngine> engine;
  KvCapacity capacity;  // for /metrics and `kiln recipe show`
};

// The engine settings and cache pool a recipe gets with this model and memory (what start_engine uses, and what
// `kiln recipe show` reports).
struct EnginePlan {
  EngineConfig config;
  CacheSpec spec;  // every layer the pool holds: the target's, its next-n layers, a drafter's own
  KvCapacity capacity;
};
// `drafter` (null without speculative decoding) adds its cache layers and, when it runs them, the next-n layers.
Result<EnginePlan> plan_engine(const LoadedModel& model, const Recipe& recipe, const Drafter* drafter = nullptr,
                               const EngineMemory& memory = {});

// plan_engine with the recipe's drafter (made for the occasion when the recipe speculates): what `kiln recipe show`
// reports and start_engine would use.
Result<EnginePlan> plan_recipe(const LoadedModel& model, const Recipe& recipe);

// What the pool rule sets aside for the largest step's activations when the caller gives no workspace_bytes: one of
// max_num_batched_tokens tokens of several sequences (max_num_seqs logit rows), or a lone prompt's of up to
// max(max_num_batched_tokens, lone_prompt_tokens) — with tile_rows > 0 run in tiles of that many rows (the CUDA
// runner's layer-major prefill, prefill_tile_rows_for), its activations one tile's but for what every row keeps (a few
// hidden-widths, `taps` more for a drafter's tapped layers) and each key's slot in the prefill workspace.
// The memory model (memory_model.h) reads it too.
uint64_t workspace_estimate(const ModelInfo& info, const EngineConfig& config, int64_t tile_rows = 0, int64_t taps = 0);

// The CUDA runner's layer-major prefill tile (model/batch_invariance.h's cuda_prefill_tile_rows) for a lone prompt's
// steps — unless MTP layers run over the prompt too (their steps are not tiled), the model has a DSA indexer (its
// prompts attend through the selection, not the tiled prefill kernel) or the context is split over ranks; else 0.
// Rounded to whole KV blocks of block_size tokens as the runner rounds it (effective_prefill_tile_rows).
int64_t prefill_tile_rows_for(const ModelInfo& info, bool mtp_steps, int64_t decode_context, int64_t block_size);

// The model-loading options a recipe implies: drafters other than `none` may run the checkpoint's next-n
// (MTP) layers, so those are loaded too.
ModelLoadOptions model_load_options(const Recipe& recipe);

// The pool a plan describes, in the model's device memory.
Result<std::shared_ptr<CacheManager>> make_cache_manager(const LoadedModel& model, const EnginePlan& plan);

// `model` must outlive the engine. With `speculative.method` other than "none", the drafter is created through the
// registry with the engine's DraftServices on the model's device, and decodes draft speculative.depth tokens.
// With `predicted` (the feasibility screen taken before load, memory_model.h) the memory measured once the cache
// pool is allocated is logged beside its interval.
Result<StartedEngine> start_engine(const LoadedModel& model, const Recipe& recipe, const EngineMemory& memory = {},
                                   const MemoryModel* predicted = nullptr);

// The bytes of the checkpoint files a model maps (0 for dummy weights): its weights on the CPU.
uint64_t checkpoint_bytes(const LoadedModel& model);

}  // namespace kiln
