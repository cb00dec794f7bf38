// The plugin's descriptor and the `fp8_ds_mla` factory: the geometry from the model and [kv], then the half for
// the device asked for (CUDA where the plugin was built with nvcc).
#include <string>

#include "fp8_mla_layout.h"
#include "fp8_mla_row.h"
#include "kiln/plugin.h"

namespace kiln::fp8mla {
namespace {

Result<std::unique_ptr<KvLayout>> make_layout(const CreateContext& ctx) {
  if (ctx.model == nullptr)
    return failed_precondition("kv layout `fp8_ds_mla` needs the model's kv_lora_rank and qk_rope_head_dim");
  KvGeometry g;
  g.latent_dim = ctx.model->kv_lora_rank;
  g.rope_dim = ctx.model->qk_rope_head_dim;
  g.block_size = ctx.section ? ctx.section->get_int("block_size", 64) : 64;
  if (g.latent_dim <= 0 || g.rope_dim < 0 || g.block_size < 1)
    return invalid_argument("kv layout `fp8_ds_mla`: kv_lora_rank " + std::to_string(g.latent_dim) +
                            ", qk_rope_head_dim " + std::to_string(g.rope_dim) + ", block_size " +
                            std::to_string(g.block_size) + " (needs a latent, and pages of at least 1 token)");
  if (ctx.device.is_cpu()) return make_cpu_layout(g);
#ifdef KV_FP8MLA_WITH_CUDA
  return make_cuda_layout(g, ctx.device);
#else
  return unimplemented("kv layout `fp8_ds_mla` was built without CUDA (no nvcc when the plugin was built)");
#endif
}

DeviceSet devices() {
#ifdef KV_FP8MLA_WITH_CUDA
  return DeviceSet::cpu_and_cuda();
#else
  return DeviceSet::cpu();
#endif
}

Status register_fp8mla(Registrar& registrar) {
  // [kv] block_size is the core's key (it pages every layout), so the layout adds none.
  return registrar.add<KvLayout>("fp8_ds_mla",
                                 "MLA cache in float8 e4m3 with an fp32 scale per 128 latent values and a bf16 rope "
                                 "part (656 bytes a token for 512 + 64, 528 for NoPE 512)",
                                 &make_layout, devices());
}

}  // namespace
}  // namespace kiln::fp8mla

KILN_PLUGIN("kv-fp8mla", "0.1.0", "the fp8_ds_mla KV layout (DeepSeek V3.2's FP8 MLA cache)",
            &kiln::fp8mla::register_fp8mla)
