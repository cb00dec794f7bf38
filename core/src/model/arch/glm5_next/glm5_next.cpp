#include "model/arch/glm5_next/glm5_next.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/arch/glm5_next/glm5_next_cpu_instance.h"
#ifdef KILN_WITH_CUDA
#include "model/arch/glm5_next/cuda/glm5_next_cuda_model.h"
#endif
#include "model/arch/glm5_next/glm5_next_mtp_layout.h"
#include "model/arch/glm5_next/glm5_next_sharded_source.h"
#include "model/checkpoint.h"
#include "model/model_instance.h"

namespace kiln::arch {

namespace {

LayerCacheSpec layer_cache(const glm5_next::Glm5NextConfig& c, bool kda, bool indexer, int state_shares) {
  LayerCacheSpec layer;
  if (kda) {
    // One slot holds both: the recurrent state, then the conv state (the CUDA kernels' slot format), so a
    // snapshot or restore is one copy. A rank with a pool of its own keeps its heads' part only.
    const int64_t heads = TensorShard{0, std::max(state_shares, 1)}.max_count(c.linear_num_heads);
    layer.entries.push_back({CacheKind::kState, "kda_state", 0, c.kda_state_bytes(heads)});
  } else {
    layer.entries.push_back({CacheKind::kMlaLatent, "mla", 0, 0});
    if (indexer) {  // [k | compress-gate score] fp32 per token, whatever the layout (see cache_spec)
      layer.entries.push_back({CacheKind::kPagedRows, "indexer_rows", 2 * sizeof(float) * c.index_head_dim, 0});
      // A complete pool's key never changes: the CUDA runner computes it once, into row slot(first token) / pool
      // of this entry (a pool's share of a row per token). The CPU model recomputes keys from the rows instead.
      layer.entries.push_back({CacheKind::kPagedRows, "indexer_pool_keys", c.pool_key_bytes_per_token(), 0});
    }
  }
  return layer;
}

}  // namespace

CacheSpec Glm5NextArchitecture::cache_spec(int64_t mtp_layers, IndexerKeyFormat keys, int state_shares) const {
  // The layout's indexer key format is not applied here, on purpose: GLM-5.3-Flash's k-pool indexer never scores a
  // token's key. Its rows are the inputs of the pool compression (key and gate logits, softmaxed over 16 tokens per
  // channel, where an e4m3 gate error becomes a multiplicative weight error), and its scored keys are the pool keys,
  // 1/16 of a row per token already. No published engine defines an fp8 form of either, so both stay fp32 under
  // every layout (plugins/kv-fp8mla/README.md).
  static_cast<void>(keys);
  const glm5_next::Glm5NextConfig& c = config_;
  CacheSpec spec;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    spec.layers.push_back(layer_cache(c, c.is_kda(l), c.runs_indexer(l), state_shares));
  // A next-n layer caches what a trunk layer of its kind does, in the same pages and state slots (layer index
  // num_hidden_layers + i). Layers the checkpoint does not hold are never run and cache nothing.
  for (int64_t i = 0; i < mtp_layers; ++i) {
    if (i >= static_cast<int64_t>(c.mtp.size())) {
      spec.layers.emplace_back();
      continue;
    }
    const glm5_next::MtpLayerLayout& m = c.mtp[i];
    spec.layers.push_back(layer_cache(c, m.attention == glm5_next::AttentionKind::kKda, m.indexer, state_shares));
  }
  return spec;
}

Status Glm5NextArchitecture::supports(DeviceType device) const {
  if (device == DeviceType::kCpu) return ok_status();
#ifdef KILN_WITH_CUDA
  return glm5_next::cuda::Glm5NextCudaModel::supports(config_);
#else
  return unimplemented("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
#endif
}

Status Glm5NextArchitecture::supports_parallel(int tensor, int decode_context, DeviceType device) const {
  if (decode_context > 1 && device == DeviceType::kCuda)
    return unimplemented("parallel.decode_context = " + std::to_string(decode_context) +
                         " on CUDA: glm5_next's CUDA runner keeps its caches whole on one GPU (decode-context "
                         "parallelism of glm5_next runs on CPU ranks: set model.device = \"cpu\", or "
                         "parallel.decode_context = 1)");
  // On CPU ranks the DSA layers' latents and indexer rows split by token; KDA state is per sequence and stays whole.
  // On CUDA one process per GPU holds its heads, columns, experts and vocabulary rows (Glm5NextCudaModel).
  if (tensor <= 1) return ok_status();
  return glm5_next::check_glm5_next_tensor_parallel_units(config_, tensor);
}

Result<std::unique_ptr<ModelInstance>> Glm5NextArchitecture::build(const BuildContext& ctx) const {
  if (!ctx.source || !ctx.format || !ctx.layout || !ctx.device)
    return invalid_argument("building glm5_next needs a weight source, format, KV layout and device");
  const KvGeometry g = ctx.layout->geometry();
  if (g.latent_dim != config_.kv_lora_rank || g.rope_dim != 0)
    return failed_precondition("the KV layout has geometry " + std::to_string(g.latent_dim) + "+" +
                               std::to_string(g.rope_dim) + ", glm5_next's DSA layers need " +
                               std::to_string(config_.kv_lora_rank) + "+0 (a latent and no rope part)");
  const int collective_ranks = ctx.collective ? ctx.collective->world_size() : 1;
  KILN_RETURN_IF_ERROR(supports_parallel(std::max(ctx.tensor_parallel, collective_ranks), ctx.decode_context,
                                         ctx.device->device().type));
  if (ctx.device->device().is_cuda()) {
#ifdef KILN_WITH_CUDA
    KILN_RETURN_IF_ERROR(supports(DeviceType::kCuda));
    // One process per rank: this process's rank of the group, on its device.
    if (collective_ranks > 1) {
      KILN_ASSIGN_OR_RETURN(auto m, glm5_next::cuda::Glm5NextCudaModel::create_rank(config_, ctx));
      return std::unique_ptr<ModelInstance>(std::move(m));
    }
    if (ctx.tensor_parallel > 1)
      return unimplemented("parallel.tensor = " + std::to_string(ctx.tensor_parallel) + " on CUDA with "
                           "transport.backend = \"local\" (ranks as threads): glm5_next's CUDA runner runs one rank per "
                           "process; set transport.backend = \"nccl\" (one GPU per rank) or \"socket\" (ranks meeting "
                           "through host memory, e.g. two ranks on one GPU)");
    KILN_ASSIGN_OR_RETURN(auto m, glm5_next::cuda::Glm5NextCudaModel::create(config_, ctx));
    return std::unique_ptr<ModelInstance>(std::move(m));
#else
    return unimplemented("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
#endif
  }
  // Without next-n layers in the checkpoint none is loaded (num_mtp_layers() = 0), and a drafter that needs them
  // is refused at engine start; a layer of a layout kiln does not know is refused here, naming its tensors.
  if (ctx.load_mtp && !config_.mtp_refusal.empty()) return failed_precondition(config_.mtp_refusal);
  // Tensor parallelism on CPU ranks: this process's rank of a group of processes, or every rank as threads here.
  if (collective_ranks > 1) return glm5_next::Glm5NextCpuInstance::create_process_rank(config_, ctx);
  if (ctx.tensor_parallel > 1) return glm5_next::Glm5NextCpuInstance::create_tensor_parallel(config_, ctx);
  KILN_ASSIGN_OR_RETURN(auto m, glm5_next::Glm5NextCpuInstance::create(config_, ctx));
  return std::unique_ptr<ModelInstance>(std::move(m));
}


Result<std::unique_ptr<Architecture>> parse_glm5_next(const nlohmann::json& config, const std::string& source) {
  KILN_ASSIGN_OR_RETURN(glm5_next::Glm5NextConfig c, glm5_next::Glm5NextConfig::from_json(config, source));
  // The next-n layers' structure is in the checkpoint's names only (glm5_next_mtp_layout.h): read them when the
  // checkpoint sits beside its config.json. Headers only; nothing is read from the tensors.
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(source).parent_path();
  if (!dir.empty() && (std::filesystem::exists(dir / Checkpoint::kSingleFileName, ec) ||
                       std::filesystem::exists(dir / Checkpoint::kIndexFileName, ec))) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::open(dir));
    glm5_next::read_mtp_layouts(checkpoint->names(), c);
  }
  return std::unique_ptr<Architecture>(new Glm5NextArchitecture(std::move(c)));
}

}  // namespace kiln::arch
