#include "builtin/register_builtins.h"

#include "builtin/dense_weight_format.h"
#include "builtin/local_collective.h"
#include "builtin/none_drafter.h"
#include "builtin/paged_mla_kv_layout.h"
#include "builtin/text_modality.h"
#include "parallel/socket_collective.h"

namespace kiln {
namespace {
// The device halves this build has.
#ifdef KILN_WITH_CUDA
constexpr DeviceSet kBuilt = DeviceSet::cpu_and_cuda();
#else
constexpr DeviceSet kBuilt = DeviceSet::cpu();
#endif
}  // namespace

Status register_builtin_capabilities(Registrar& registrar) {
  KILN_RETURN_IF_ERROR(registrar.add<WeightFormat>(
      "dense", "checkpoint weights as stored (CPU: bf16/fp16/fp32 views; CUDA: bf16 on the device)",
      &builtin::create_dense_weight_format, kBuilt));

  // [kv] block_size is a core key (the block manager pages every layout), so the layouts add none.
  KILN_RETURN_IF_ERROR(registrar.add<KvLayout>(
      "bf16", "MLA cache of bf16 [kv_lora_rank + qk_rope_head_dim] per token, paged", &builtin::create_bf16_kv_layout,
      kBuilt));
  KILN_RETURN_IF_ERROR(registrar.add<KvLayout>("fp32", "MLA cache of fp32 rows, paged: the exact reference layout",
                                               &builtin::create_fp32_kv_layout, DeviceSet::cpu()));

  // Kinds whose built-ins do no device work run wherever the model does.
  const DeviceSet anywhere = DeviceSet::cpu_and_cuda();
  KILN_RETURN_IF_ERROR(registrar.add<Drafter>("none", "no speculative decoding", &builtin::create_none_drafter, anywhere));
  KILN_RETURN_IF_ERROR(
      registrar.add<Collective>("local", "a single rank: no communication", &builtin::create_local_collective, anywhere));
  // Ranks in separate processes (parallel/socket_collective.h): what `kiln serve` and `kiln generate` launch for
  // parallel.tensor > 1 when the recipe asks for processes instead of threads. CUDA ranks stage their buffers
  // through host memory (runtime/cuda/host_staged_collective.h): a correctness path, e.g. two ranks on one GPU.
  KILN_RETURN_IF_ERROR(registrar.add<Collective>(
      "socket",
      "ranks in separate processes (one per rank, any machines) over TCP, rank-order reductions; CUDA ranks stage "
      "through host memory (a correctness path, no CUDA graphs)",
      &create_socket_collective, kBuilt, SectionSchema{{transport_timeout_key()}}));
  KILN_RETURN_IF_ERROR(
      registrar.add<Modality>("text", "text only: accepts no media", &builtin::create_text_modality, anywhere));
  return ok_status();
}

}  // namespace kiln
