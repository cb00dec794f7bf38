#include "engine/engine_factory.h"

#include <algorithm>
#include <filesystem>

#include "engine/instance_runner.h"
#include "engine/speculative_drafter.h"
#include "kiln/log.h"
#include "model/batch_invariance.h"
#include "plugin/registry.h"
#include "recipe/drafter_settings.h"
#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace kiln {
namespace {

// The device's memory, all of it and what is in use now (by this process or any other).
void device_memory(uint64_t& total, uint64_t& used) {
  total = used = 0;
#ifdef KILN_WITH_CUDA
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    total = total_b;
    used = total_b - free_b;
  }
#endif
}

}  // namespace

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
uint64_t workspace_estimate(const ModelInfo& c, const EngineConfig& e, int64_t tile_rows, int64_t taps) {
  const uint64_t per_token =
      static_cast<uint64_t>(32 * c.hidden_size + c.num_heads * (c.kv_lora_rank + c.qk_rope_head_dim));
  const uint64_t logits = static_cast<uint64_t>(e.max_num_seqs) * static_cast<uint64_t>(c.vocab_size);
  const uint64_t mixed = static_cast<uint64_t>(e.max_num_batched_tokens);
  const uint64_t lone = std::max(mixed, static_cast<uint64_t>(e.lone_prompt_tokens));
  const uint64_t tiled = tile_rows > 0 && lone > static_cast<uint64_t>(tile_rows) ? static_cast<uint64_t>(tile_rows) : lone;
  // A tiled step's rows keep their fp32 residual stream and hidden row, bf16 block input and normed row (3
  // hidden-widths of fp32) and the drafter's taps; the layer's keys stay in the prefill workspace for the tiles after
  // (a bf16 latent + rope row and every head's expanded K nope and V: half as many fp32 words).
  const uint64_t past_tile_row =
      static_cast<uint64_t>((3 + std::max<int64_t>(taps, 0)) * c.hidden_size) +
      static_cast<uint64_t>(c.kv_lora_rank + c.qk_rope_head_dim + c.num_heads * (c.qk_nope_head_dim + c.v_head_dim) + 1) / 2;
  const uint64_t lone_bytes = tiled * per_token + (lone - tiled) * past_tile_row;
  // With one sequence every step of more rows than a tile is a lone prompt's; with several, any step may be whole.
  const uint64_t step = e.max_num_seqs == 1 ? lone_bytes : std::max(lone_bytes, mixed * per_token);
  return 4 * (step + logits);
}

int64_t prefill_tile_rows_for(const ModelInfo& info, bool mtp_steps, int64_t decode_context, int64_t block_size) {
  if (mtp_steps || info.index_head_dim > 0 || decode_context > 1) return 0;
  return effective_prefill_tile_rows(cuda_prefill_tile_rows(), block_size);
}

ModelLoadOptions model_load_options(const Recipe& recipe) {
  ModelLoadOptions o;
  o.load_mtp = recipe.section("speculative").get_string("method", "none") != "none";
  return o;
}

Result<EnginePlan> plan_engine(const LoadedModel& m, const Recipe& recipe, const Drafter* drafter,
                               const EngineMemory& given) {
  EngineMemory memory = given;
  if (m.on_gpu() && memory.memory_bytes == 0) {  // the pool is sized from the device's memory and the weights
    memory.cpu = false;
    // What the device holds already (the weights with their arena's slack, the CUDA context, cuBLAS, other
    // processes) is measured rather than summed from tensor sizes, which undercount it by gigabytes.
    uint64_t total = 0, used = 0;
    device_memory(total, used);
    memory.memory_bytes = total;
    // Rank 0 of GPU ranks: the pool is mirrored on every rank, so it must fit beside the largest rank's shard too.
    memory.weight_bytes = std::max<uint64_t>(m.model->weight_bytes(), used) + m.rank_weight_excess;
  }
  const RecipeSection& scheduler = recipe.section("scheduler");
  KILN_ASSIGN_OR_RETURN(EngineConfig config, engine_config_from_recipe(scheduler, m.info.max_position_embeddings));

  EnginePlan plan;
  const DrafterCapabilities caps = drafter ? drafter->capabilities() : DrafterCapabilities{};
  const int64_t mtp_layers = caps.needs_target_mtp ? m.model->num_mtp_layers() : 0;
  // One process per rank (a collective spanning processes): each rank's pool is its own, so its state slots hold
  // its heads' part only (every rank mirrors this spec from rank 0).
  const int own_pool_ranks = m.collective ? m.collective->world_size() : 1;
  plan.spec = m.arch->cache_spec(mtp_layers, m.layout->indexer_key_format(), own_pool_ranks);
  for (const LayerCacheSpec& l : caps.cache_layers) plan.spec.layers.push_back(l);

  KvPoolBudget budget;
  budget.memory_bytes = memory.memory_bytes != 0 ? memory.memory_bytes : physical_memory_bytes();
  budget.utilization = scheduler.get_float("gpu_memory_utilization", 0.9);
  budget.weight_bytes = memory.weight_bytes != 0 ? memory.weight_bytes : checkpoint_bytes(m);
  // With scheduler.batch_invariant the steps BatchEngine will run (it applies the runner's bound the same way), not
  // the recipe's max_num_batched_tokens: the pool gets what those small steps leave.
  EngineConfig steps = config;
  if (config.batch_invariant) {
    const BatchInvariance bound = m.model->batch_invariance();
    if (bound.bounded()) {
      steps.max_num_batched_tokens = std::max<int64_t>(
          1, std::min({config.max_num_batched_tokens, bound.rows, bound.logit_rows}));
      steps.lone_prompt_tokens = 0;
    }
  }
  const int64_t tile = m.on_gpu() ? prefill_tile_rows_for(m.info, caps.needs_target_mtp,
                                                         recipe.section("parallel").get_int("decode_context", 1),
                                                         scheduler_block_size(m))
                                  : 0;
  const int64_t taps = static_cast<int64_t>(std::count_if(caps.tap_layers.begin(), caps.tap_layers.end(),
                                                          [](int t) { return t != kTapFinalNormed; }));
  budget.workspace_bytes =
      memory.workspace_bytes != 0 ? memory.workspace_bytes : workspace_estimate(m.info, steps, tile, taps);
  // State slots (and their snapshots) for every sequence that may run come off the top.
  budget.workspace_bytes += 2 * static_cast<uint64_t>(config.max_num_seqs) * plan.spec.bytes_per_sequence();
  budget.bytes_per_token = plan.spec.bytes_per_token(m.layout->bytes_per_token());
  budget.block_size = scheduler_block_size(m);
  budget.stored_per_block = stored_block_size(m);
  if (budget.stored_per_block != budget.block_size && !caps.cache_layers.empty())
    return unimplemented("`speculative.method = \"" + recipe.section("speculative").get_string("method") +
                         "\"` keeps a KV cache of its own, which is not split over the GPU ranks of "
                         "parallel.decode_context yet; draft with mtp, or set parallel.decode_context = 1");
  budget.max_model_len = config.max_model_len;
  // Also on the GPU for now: a pool past what max_num_seqs full-length sequences can use only grows the
  // BlockManager's host tables (the prefix cache would use it, at the cost of host memory per block).
  budget.max_tokens = config.max_num_seqs * config.max_model_len;
  const RecipeSection& spec = recipe.section("speculative");
  if (drafter && spec.get_string("method", "none") != "none") {
    // The target's recurrent state is rolled back after a rejection (snapshot before verification, then the
    // accepted tokens fed again: BatchEngine); a next-n layer's by the draft services, which keep its state as of
    // the accepted rows (EngineDraftServices::mtp_run). A drafter's own layers are rolled back by position only,
    // so one that keeps recurrent state cannot draft yet.
    const int64_t own_layers_from = static_cast<int64_t>(m.arch->cache_spec(0, IndexerKeyFormat::kFp32).layers.size()) + mtp_layers;
    for (size_t l = static_cast<size_t>(own_layers_from); l < plan.spec.layers.size(); ++l)
      for (const CacheEntry& e : plan.spec.layers[l].entries)
        if (e.kind == CacheKind::kState)
          return unimplemented("`speculative.method = \"" + spec.get_string("method") + "\"` (" + spec.origin("method") +
                               "): drafter layer " + std::to_string(l - own_layers_from) + " keeps recurrent state (" +
                               e.name + "), and rolling a drafter's own state back is not implemented yet");
    config.speculative_depth = spec.get_int("depth", 0);
    config.speculative_max_batch = spec.get_int("max_batch", 0);
    // A verification pass writes positions L .. L + K; after it accepts all K, a drafter sharing the pages (the
    // next-n layers) writes its recursive rows up to K − 1 positions further, before the next step grows the table.
    config.lookahead_slots = 2 * config.speculative_depth;
  }
  KILN_ASSIGN_OR_RETURN(plan.capacity, plan_kv_capacity(budget));
  plan.capacity.state_bytes = 2 * static_cast<uint64_t>(config.max_num_seqs) * plan.spec.bytes_per_sequence();
  plan.capacity.max_num_seqs = config.max_num_seqs;
  config.num_blocks = plan.capacity.num_blocks;
  config.block_size = plan.capacity.block_size;
  plan.config = config;
  return plan;
}

Result<std::shared_ptr<CacheManager>> make_cache_manager(const LoadedModel& m, const EnginePlan& plan) {
  CacheManagerConfig cm;
  cm.num_blocks = plan.config.num_blocks;
  cm.block_size = plan.config.block_size;
  cm.stored_per_block = stored_block_size(m);
  cm.prefix_caching = plan.config.prefix_caching;
  cm.lookahead_slots = plan.config.lookahead_slots;
  cm.state_slots = plan.config.max_num_seqs;
  cm.target_layers = static_cast<int64_t>(m.arch->cache_spec(0, IndexerKeyFormat::kFp32).layers.size());
  KILN_ASSIGN_OR_RETURN(auto made, CacheManager::create(plan.spec, m.layout.get(), m.device.get(), cm));
  made->set_state_mirror(m.model.get());
  return std::shared_ptr<CacheManager>(std::move(made));
}

namespace {

// The recipe's drafter with its services, or nothing when the recipe does not speculate.
Status make_drafter(const LoadedModel& m, const Recipe& recipe, std::unique_ptr<EngineDraftServices>& services,
                    std::shared_ptr<Drafter>& drafter) {
  const RecipeSection& spec = recipe.section("speculative");
  if (spec.get_string("method", "none") == "none" || spec.get_int("depth", 0) <= 0) {
    // Nothing drafts, so nothing reads the drafter-only keys: setting them is an error, as with any drafter that
    // does not read them.
    const std::vector<Status> problems = check_drafter_settings(spec, DrafterCapabilities{});
    return problems.empty() ? ok_status() : problems.front();
  }
  services = std::make_unique<EngineDraftServices>(*m.model, m.format, m.info.num_layers, spec.get_string("draft_model"));
  KILN_ASSIGN_OR_RETURN(drafter, create_drafter(recipe, global_registry(), m.info, *m.device, services.get()));
  if (drafter->capabilities().needs_target_mtp && m.model->num_mtp_layers() == 0)
    return failed_precondition("`speculative.method = \"" + spec.get_string("method") + "\"` (" + spec.origin("method") +
                               ") runs the checkpoint's next-n (MTP) layers, and " + m.info.model_type + " at " +
                               recipe.section("model").get_string("path") +
                               " has none (num_nextn_predict_layers = 0, or its next-n weights were left out of the "
                               "export); choose a checkpoint with its next-n layer or a drafter that needs no weights");
  return ok_status();
}

// The recipe's modality on the model's device, for the request path (the server encodes media parts with it).
Result<std::shared_ptr<Modality>> make_modality(const LoadedModel& m, const Recipe& recipe) {
  const RecipeSection& media = recipe.section("media");
  CreateContext ctx;
  ctx.device = m.device->device();
  ctx.device_context = m.device.get();
  ctx.model = &m.info;
  ctx.section = &media;
  const std::string name = media.get_string("modality", "text");
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Modality> modality, global_registry().create<Modality>(name, ctx));
  if (media.get_bool("video", false) && !modality->accepts_video())
    return media.error("video", "the modality `" + name + "` accepts no video; select one that does or remove the key");
  return modality;
}

}  // namespace

Result<EnginePlan> plan_recipe(const LoadedModel& m, const Recipe& recipe) {
  std::unique_ptr<EngineDraftServices> services;
  std::shared_ptr<Drafter> drafter;
  KILN_RETURN_IF_ERROR(make_drafter(m, recipe, services, drafter));
  return plan_engine(m, recipe, drafter.get());
}

Result<StartedEngine> start_engine(const LoadedModel& m, const Recipe& recipe, const EngineMemory& memory,
                                   const MemoryModel* predicted) {
  StartedEngine started;
  const RecipeSection& spec = recipe.section("speculative");
  KILN_RETURN_IF_ERROR(make_drafter(m, recipe, started.draft_services, started.drafter));
  KILN_ASSIGN_OR_RETURN(EnginePlan plan, plan_engine(m, recipe, started.drafter.get(), memory));
  log::info("{}", plan.capacity.report());
  if (plan.spec.has_state() && plan.config.prefix_caching)
    log::info("prefix caching is off for {}: it keeps recurrent state per sequence, which cached KV blocks do not "
              "hold, so every prompt is computed from its first token",
              m.info.model_type);
  started.capacity = plan.capacity;
  KILN_ASSIGN_OR_RETURN(started.caches, make_cache_manager(m, plan));
  // The modality before the measurement: the image modality loads its vision tower now, which the memory model
  // counts among what is held at load.
  KILN_ASSIGN_OR_RETURN(started.modality, make_modality(m, recipe));
  if (predicted) {
    const MeasuredMemory measured = measure_memory(*predicted, m.on_gpu(), checkpoint_bytes(m));
    if (memory_within(*predicted, measured))
      log::info("{}", memory_comparison(*predicted, measured));
    else
      log::warn("{}", memory_comparison(*predicted, measured));
  }
  if (started.draft_services) {
    const int64_t drafter_layers = static_cast<int64_t>(started.drafter->capabilities().cache_layers.size());
    started.draft_services->attach(started.caches.get(),
                                   static_cast<int64_t>(plan.spec.layers.size()) - drafter_layers);
    log::info("speculative decoding: drafter `{}`, depth {}", spec.get_string("method"), plan.config.speculative_depth);
  }
  auto runner = std::make_unique<InstanceRunner>(*m.model, *started.caches);
  KILN_ASSIGN_OR_RETURN(started.engine,
                        BatchEngine::create(plan.config, std::move(runner), started.drafter, started.caches));
  return started;
}

}  // namespace kiln
