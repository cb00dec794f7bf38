#include "model/mla_moe_architecture.h"

#include <nlohmann/json.hpp>

#include "model/mla_moe_cpu_instance.h"
#ifdef KILN_WITH_CUDA
#include "runtime/cuda/cuda_mla_moe_model.h"
#endif

namespace kiln {

CacheSpec MlaMoeArchitecture::cache_spec(int64_t mtp_layers, IndexerKeyFormat keys, int) const {
  const ModelConfig& c = config_;
  CacheSpec spec;
  for (int64_t l = 0; l < c.num_hidden_layers + mtp_layers; ++l) {
    LayerCacheSpec layer;
    layer.entries.push_back({CacheKind::kMlaLatent, "mla", 0, 0});
    // Layers that run their own indexer keep its keys, in the layout's format (fp32, or e4m3 + scale under
    // fp8_ds_mla); "shared" layers reuse an earlier layer's selection.
    if (c.has_indexer() && !c.indexer_is_shared(l))
      layer.entries.push_back({CacheKind::kPagedRows, "indexer_keys", indexer_key_row_bytes(keys, c.index_head_dim), 0});
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

Status MlaMoeArchitecture::supports(DeviceType device) const {
  if (device == DeviceType::kCpu) return ok_status();
#ifdef KILN_WITH_CUDA
  return cuda::CudaMlaMoeModel::supports(config_);
#else
  return unimplemented("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
#endif
}

Status MlaMoeArchitecture::supports_parallel(int tensor, int decode_context, DeviceType device) const {
  // On CUDA the KV cache splits over a whole tensor-parallel group (decode_context = parallel.tensor, which `kiln
  // recipe check` and create_rank hold the recipe to); what the model itself allows is judged here.
  if (device != DeviceType::kCuda || decode_context <= 1) return ok_status();
#ifdef KILN_WITH_CUDA
  return cuda::CudaMlaMoeModel::supports_decode_context(config_, decode_context, decode_context);
#else
  return unimplemented("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
#endif
}

Result<std::unique_ptr<ModelInstance>> MlaMoeArchitecture::build(const BuildContext& ctx) const {
  if (!ctx.source || !ctx.format || !ctx.layout || !ctx.device)
    return invalid_argument("building " + config_.model_type + " needs a weight source, format, KV layout and device");
  const KvGeometry g = ctx.layout->geometry();
  if (g.latent_dim != config_.kv_lora_rank || g.rope_dim != config_.qk_rope_head_dim)
    return failed_precondition("the KV layout has geometry " + std::to_string(g.latent_dim) + "+" +
                               std::to_string(g.rope_dim) + ", the model needs " + std::to_string(config_.kv_lora_rank) +
                               "+" + std::to_string(config_.qk_rope_head_dim));
  const int collective_ranks = ctx.collective ? ctx.collective->world_size() : 1;
  // One process per rank: this process's rank of the group, on its device.
  if (collective_ranks != 1 && ctx.device->device().is_cuda()) {
#ifdef KILN_WITH_CUDA
    KILN_RETURN_IF_ERROR(supports(DeviceType::kCuda));
    KILN_ASSIGN_OR_RETURN(auto m, cuda::CudaMlaMoeModel::create_rank(config_, ctx));
    return std::unique_ptr<ModelInstance>(std::move(m));
#else
    return unimplemented("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
#endif
  }
  if (collective_ranks != 1) return MlaMoeCpuInstance::create_process_rank(config_, ctx);
  if (ctx.decode_context > 1 && ctx.device->device().is_cuda())
    return unimplemented("parallel.decode_context = " + std::to_string(ctx.decode_context) + " on CUDA needs one process "
                         "per rank: set transport.backend = \"nccl\" (one GPU per rank) or \"socket\"");
  // Ranks as threads of one process share its device; a CUDA runner is one rank per process.
  if (ctx.tensor_parallel > 1 && ctx.device->device().is_cuda())
    return unimplemented("parallel.tensor = " + std::to_string(ctx.tensor_parallel) + " on CUDA with transport.backend = "
                         "\"local\" (ranks as threads): the CUDA runner of " + config_.model_type + " runs one rank per "
                         "process; set transport.backend = \"nccl\" (one GPU per rank) or \"socket\" (ranks meeting "
                         "through host memory, e.g. two ranks on one GPU)");
  if (ctx.tensor_parallel > 1) return MlaMoeCpuInstance::create_tensor_parallel(config_, ctx);
  if (ctx.device->device().is_cuda()) {
#ifdef KILN_WITH_CUDA
    KILN_RETURN_IF_ERROR(supports(DeviceType::kCuda));
    KILN_ASSIGN_OR_RETURN(auto m, cuda::CudaMlaMoeModel::create(config_, ctx));
    return std::unique_ptr<ModelInstance>(std::move(m));
#else
    return unimplemented("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
#endif
  }
  KILN_ASSIGN_OR_RETURN(auto m, MlaMoeCpuInstance::create(config_, ctx));
  return std::unique_ptr<ModelInstance>(std::move(m));
}

Result<std::unique_ptr<Architecture>> parse_mla_moe_architecture(const nlohmann::json& config, const std::string& source,
                                                                 const MlaMoeVariant& variant) {
  KILN_ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::from_json(config, source, variant));
  return std::unique_ptr<Architecture>(new MlaMoeArchitecture(std::move(c)));
}

// ModelConfig's registry-backed readers (the family's config of whichever member config.json names).
Result<ModelConfig> ModelConfig::from_json(const nlohmann::json& json, const std::string& source_name) {
  KILN_ASSIGN_OR_RETURN(auto arch, parse_architecture(json, source_name));
  const auto* family = dynamic_cast<const MlaMoeArchitecture*>(arch.get());
  if (!family) return unimplemented(source_name + ": model_type '" + arch->model_type() + "' is not an MLA + MoE model");
  return family->config();
}

Result<ModelConfig> ModelConfig::load(const std::filesystem::path& config_json) {
  KILN_ASSIGN_OR_RETURN(auto arch, load_architecture(config_json));
  const auto* family = dynamic_cast<const MlaMoeArchitecture*>(arch.get());
  if (!family)
    return unimplemented(config_json.string() + ": model_type '" + arch->model_type() + "' is not an MLA + MoE model");
  return family->config();
}

}  // namespace kiln
