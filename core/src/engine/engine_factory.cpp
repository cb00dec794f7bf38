#include "engine/engine_factory.h"

#include <algorithm>
#include <filesystem>

#include "engine/mla_moe_runner.h"
#include "engine/speculative_drafter.h"
#include "model/draft_host.h"
#include "plugin/registry.h"
#include "kiln/log.h"
#ifdef KILN_WITH_CUDA
#include "runtime/cuda/cuda_draft_host.h"
#include "runtime/cuda/cuda_mla_moe_model.h"
#endif

namespace kiln {
namespace {

uint64_t checkpoint_bytes(const LoadedModel& m) {
  uint64_t total = 0;
  if (!m.checkpoint) return 0;
  for (const auto& f : m.checkpoint->files()) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(f, ec);
    if (!ec) total += size;
  }
  return total;
}

// fp32 activations of one step of max_num_batched_tokens tokens: the residual stream and the widest
// intermediates of attention and the MoE block come to a few dozen hidden-widths per token; plus one logits
// row per running sequence. An estimate: the point is to leave room, not to account to the byte.
uint64_t workspace_estimate(const ModelConfig& c, const EngineConfig& e) {
  const uint64_t per_token =
      static_cast<uint64_t>(32 * c.hidden_size + c.num_attention_heads * (c.kv_lora_rank + c.qk_rope_head_dim));
  return 4 * (static_cast<uint64_t>(e.max_num_batched_tokens) * per_token +
              static_cast<uint64_t>(e.max_num_seqs) * static_cast<uint64_t>(c.vocab_size));
}

// Next-n layers the engine's drafter can run: those on the device the model runs on.
int64_t mtp_layers(const LoadedModel& m) {
#ifdef KILN_WITH_CUDA
  if (m.gpu) return m.gpu->num_mtp_layers();
#endif
  return static_cast<int64_t>(m.model->weights().mtp.size());
}

}  // namespace

Result<std::unique_ptr<DraftHost>> make_draft_host(const LoadedModel& m, const Recipe& recipe, const Registry& registry,
                                                   int64_t capacity_tokens) {
#ifdef KILN_WITH_CUDA
  if (m.gpu) {
    const RecipeSection& spec = recipe.section("speculative");
    if (spec.get_string("draft_kv_dtype", "bf16") != "bf16")
      return unimplemented("`speculative.draft_kv_dtype` (" + spec.origin("draft_kv_dtype") +
                           "): the CUDA runner keeps the drafter's KV in bf16; set it to \"bf16\"");
    KILN_ASSIGN_OR_RETURN(auto host, cuda::CudaMtpDraftHost::create(*m.gpu, capacity_tokens,
                                                                    m.layout->geometry().block_size));
    return std::unique_ptr<DraftHost>(std::move(host));
  }
#endif
  KILN_ASSIGN_OR_RETURN(auto host, make_mtp_draft_host(m, recipe, registry, capacity_tokens));
  return std::unique_ptr<DraftHost>(std::move(host));
}

ModelLoadOptions model_load_options(const Recipe& recipe) {
  ModelLoadOptions o;
  o.load_mtp = recipe.section("speculative").get_string("method", "none") != "none";
  return o;
}

Result<EnginePlan> plan_engine(const LoadedModel& m, const Recipe& recipe, const EngineMemory& given) {
  EngineMemory memory = given;
#ifdef KILN_WITH_CUDA
  if (m.gpu && memory.memory_bytes == 0) {  // the pool is sized from the device's memory and the uploaded weights
    memory.cpu = false;
    // What the device holds already (the weights with their arena's slack, the CUDA context, cuBLAS, other
    // processes) is measured rather than summed from tensor sizes, which undercount it by gigabytes.
    memory.memory_bytes = cuda::CudaMlaMoeModel::device_total_bytes();
    memory.weight_bytes = std::max(m.gpu->weight_bytes(), cuda::CudaMlaMoeModel::device_used_bytes());
  }
#endif
  const ModelConfig& mc = m.model->config();
  const RecipeSection& scheduler = recipe.section("scheduler");
  KILN_ASSIGN_OR_RETURN(EngineConfig config, engine_config_from_recipe(scheduler, mc.max_position_embeddings));

  const int64_t layers = mc.num_hidden_layers + mtp_layers(m);
  KvPoolBudget budget;
  budget.memory_bytes = memory.memory_bytes != 0 ? memory.memory_bytes : physical_memory_bytes();
  budget.utilization = scheduler.get_float("gpu_memory_utilization", 0.9);
  budget.weight_bytes = memory.weight_bytes != 0 ? memory.weight_bytes : checkpoint_bytes(m);
  budget.workspace_bytes = memory.workspace_bytes != 0 ? memory.workspace_bytes : workspace_estimate(mc, config);
  budget.bytes_per_token =
      kv_bytes_per_token(layers, m.layout->bytes_per_token(), mc.has_indexer() ? mc.index_head_dim : 0);
  budget.block_size = m.layout->geometry().block_size;
  budget.max_model_len = config.max_model_len;
  // Also on the GPU for now: a pool past what max_num_seqs full-length sequences can use only grows the
  // BlockManager's host tables (the prefix cache would use it, at the cost of host memory per block).
  if (memory.cpu || m.gpu) budget.max_tokens = config.max_num_seqs * config.max_model_len;
  const RecipeSection& spec = recipe.section("speculative");
  if (spec.get_string("method", "none") != "none") {
    config.speculative_depth = spec.get_int("depth", 0);
    config.speculative_max_batch = spec.get_int("max_batch", 0);
    config.lookahead_slots = config.speculative_depth;
  }
  KILN_ASSIGN_OR_RETURN(KvCapacity capacity, plan_kv_capacity(budget));
  config.num_blocks = capacity.num_blocks;
  config.block_size = capacity.block_size;
  return EnginePlan{config, capacity};
}

Result<StartedEngine> start_engine(const LoadedModel& m, const Recipe& recipe, const EngineMemory& memory) {
  KILN_ASSIGN_OR_RETURN(EnginePlan plan, plan_engine(m, recipe, memory));
  const auto& [config, capacity] = plan;
  log::info("{}", capacity.report());
  StartedEngine started;
  started.capacity = capacity;
  if (config.speculative_depth > 0) {
    // The drafter's own KV pool: as many tokens as the target's (its sequences mirror the target's).
    KILN_ASSIGN_OR_RETURN(started.draft_host, make_draft_host(m, recipe, global_registry(), capacity.tokens()));
    KILN_ASSIGN_OR_RETURN(started.drafter, create_drafter(recipe, global_registry(), m.info, started.draft_host.get()));
    log::info("speculative decoding: drafter `{}`, depth {}", recipe.section("speculative").get_string("method"),
              config.speculative_depth);
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, make_model_runner(m, capacity.num_blocks, capacity.block_size));
  KILN_ASSIGN_OR_RETURN(started.engine, BatchEngine::create(config, std::move(runner), started.drafter));
  return started;
}

Result<std::unique_ptr<ModelRunner>> make_model_runner(const LoadedModel& m, int64_t num_blocks, int64_t block_size) {
#ifdef KILN_WITH_CUDA
  if (m.gpu) return m.gpu->make_runner(num_blocks, block_size);
#endif
  return std::unique_ptr<ModelRunner>(std::make_unique<MlaMoeRunner>(*m.model, make_kv_cache(m, num_blocks * block_size)));
}

}  // namespace kiln
