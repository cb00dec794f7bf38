// The `bf16-copy` factory: the geometry from the model and [kv], then the half for the device asked for.
#include <string>

#include "bf16_copy_layout.h"
#include "example_plugin.h"

namespace example_plugin {

kiln::DeviceSet bf16_copy_devices() {
#ifdef EXAMPLE_WITH_CUDA
  return kiln::DeviceSet::cpu_and_cuda();
#else
  return kiln::DeviceSet::cpu();  // built where nvcc was absent: the host half only
#endif
}

kiln::Result<std::unique_ptr<kiln::KvLayout>> make_bf16_copy_layout(const kiln::CreateContext& ctx) {
  if (ctx.model == nullptr)
    return kiln::failed_precondition("kv layout `bf16-copy` needs the model's kv_lora_rank and qk_rope_head_dim");
  kiln::KvGeometry g;
  g.latent_dim = ctx.model->kv_lora_rank;
  g.rope_dim = ctx.model->qk_rope_head_dim;
  g.block_size = ctx.section ? ctx.section->get_int("block_size", 64) : 64;
  if (g.latent_dim <= 0 || g.rope_dim < 0 || g.block_size < 1)
    return kiln::invalid_argument("kv layout `bf16-copy`: kv_lora_rank " + std::to_string(g.latent_dim) +
                                  ", qk_rope_head_dim " + std::to_string(g.rope_dim) + ", block_size " +
                                  std::to_string(g.block_size) + " (needs a latent, and pages of at least 1 token)");
  if (ctx.device.is_cpu()) return make_bf16_copy_cpu(g);
#ifdef EXAMPLE_WITH_CUDA
  return make_bf16_copy_cuda(g, ctx.device);
#else
  return kiln::unimplemented("kv layout `bf16-copy` was built without CUDA (no nvcc when the plugin was built)");
#endif
}

}  // namespace example_plugin
