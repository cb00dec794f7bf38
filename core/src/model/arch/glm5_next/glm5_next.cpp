#include "model/arch/glm5_next/glm5_next.h"

#include <nlohmann/json.hpp>

#include "model/arch/glm5_next/glm5_next_cpu_instance.h"
#include "model/model_instance.h"

namespace kiln::arch {

CacheSpec Glm5NextArchitecture::cache_spec(int64_t mtp_layers) const {
  const glm5_next::Glm5NextConfig& c = config_;
  CacheSpec spec;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerCacheSpec layer;
    if (c.is_kda(l)) {
      layer.entries.push_back({CacheKind::kState, "kda_recurrent", 0, c.kda_recurrent_bytes()});
      layer.entries.push_back({CacheKind::kState, "kda_conv", 0, c.kda_conv_bytes()});
    } else {
      layer.entries.push_back({CacheKind::kMlaLatent, "mla", 0, 0});
      if (c.runs_indexer(l))  // [k | compress-gate score] fp32 per token
        layer.entries.push_back({CacheKind::kPagedRows, "indexer_rows", 2 * sizeof(float) * c.index_head_dim, 0});
    }
    spec.layers.push_back(std::move(layer));
  }
  // Next-n layers are not run by this model yet (build refuses load_mtp), so they cache nothing.
  for (int64_t l = 0; l < mtp_layers; ++l) spec.layers.emplace_back();
  return spec;
}

Status Glm5NextArchitecture::supports(DeviceType device) const {
  if (device == DeviceType::kCpu) return ok_status();
  return unimplemented(
      "glm5_next runs on the CPU only for now: its CUDA runner (KDA, mHC and pooled-indexer "
      "kernels) is not written yet; set model.device = \"cpu\"");
}

Result<std::unique_ptr<ModelInstance>> Glm5NextArchitecture::build(const BuildContext& ctx) const {
  if (!ctx.source || !ctx.format || !ctx.layout || !ctx.device)
    return invalid_argument("building glm5_next needs a weight source, format, KV layout and device");
  if (ctx.device->device().is_cuda()) return supports(DeviceType::kCuda);
  const KvGeometry g = ctx.layout->geometry();
  if (g.latent_dim != config_.kv_lora_rank || g.rope_dim != 0)
    return failed_precondition("the KV layout has geometry " + std::to_string(g.latent_dim) + "+" +
                               std::to_string(g.rope_dim) + ", glm5_next's DSA layers need " +
                               std::to_string(config_.kv_lora_rank) + "+0 (a latent and no rope part)");
  if (ctx.collective && ctx.collective->world_size() > 1)
    return unimplemented("tensor parallelism: the collective spans " + std::to_string(ctx.collective->world_size()) +
                         " ranks, and glm5_next does not shard its weights (parallel.tensor = 1)");
  KILN_RETURN_IF_ERROR(supports_precision(ctx.precision));
  // ctx.load_mtp is not an error: next-n layers are not run for glm5_next yet, so none is loaded
  // (num_mtp_layers() = 0) and a drafter that needs them is refused at engine start, naming what is missing.
  KILN_ASSIGN_OR_RETURN(auto m, glm5_next::Glm5NextCpuInstance::create(config_, ctx));
  return std::unique_ptr<ModelInstance>(std::move(m));
}

Status Glm5NextArchitecture::supports_precision(Precision precision) const {
  if (precision == Precision::kFp32) return ok_status();
  return unimplemented(
      "model.precision = \"bf16\" (the CUDA runner's rounding) is not modelled for glm5_next; "
      "its CPU path is the fp32 reference (model.precision = \"fp32\")");
}

Result<std::unique_ptr<Architecture>> parse_glm5_next(const nlohmann::json& config, const std::string& source) {
  KILN_ASSIGN_OR_RETURN(glm5_next::Glm5NextConfig c, glm5_next::Glm5NextConfig::from_json(config, source));
  return std::unique_ptr<Architecture>(new Glm5NextArchitecture(std::move(c)));
}

}  // namespace kiln::arch
