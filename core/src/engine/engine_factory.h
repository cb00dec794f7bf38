// From a loaded model and its recipe to a running engine: the [scheduler] limits, the KV pool sized from the
// memory the weights leave (kv_capacity.h), the capacity report logged, the runner and the engine loop started.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/batch_engine.h"
#include "engine/kv_capacity.h"
#include "kiln/drafter.h"
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
  // Destroyed in reverse: the engine (which calls the drafter) first, then the drafter, then its host.
  std::unique_ptr<DraftHost> draft_host;
  std::shared_ptr<Drafter> drafter;
  std::unique_ptr<BatchEngine> engine;
  KvCapacity capacity;  // for /metrics and `kiln recipe show`
};

// The engine settings and KV pool a recipe gets with this model and memory (what start_engine uses, and what
// `kiln recipe show` reports).
struct EnginePlan {
  EngineConfig config;
  KvCapacity capacity;
};
Result<EnginePlan> plan_engine(const LoadedModel& model, const Recipe& recipe, const EngineMemory& memory = {});

// The model-loading options a recipe implies: drafters other than `none` may run the checkpoint's next-n
// (MTP) layers, so those are loaded too.
ModelLoadOptions model_load_options(const Recipe& recipe);

// The DraftHost over the model's MTP layers with room for `capacity_tokens` tokens: on the GPU (bf16 pages in
// device memory) when the model runs there, else on the CPU in the `speculative.draft_kv_dtype` layout.
Result<std::unique_ptr<DraftHost>> make_draft_host(const LoadedModel& model, const Recipe& recipe,
                                                   const Registry& registry, int64_t capacity_tokens);

// The runner the engine drives for this model: the CUDA runner over a fresh GPU pool when the model is on the GPU,
// else the CPU one over a KvCache. `model` must outlive it.
Result<std::unique_ptr<ModelRunner>> make_model_runner(const LoadedModel& model, int64_t num_blocks, int64_t block_size);

// `model` must outlive the engine. With `speculative.method` other than "none", the drafter is created
// through the registry with a DraftHost over the model's MTP layers, and decodes draft speculative.depth tokens.
Result<StartedEngine> start_engine(const LoadedModel& model, const Recipe& recipe, const EngineMemory& memory = {});

}  // namespace kiln
