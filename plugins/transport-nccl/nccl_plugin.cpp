// The transport-nccl plugin: registers the collective `nccl` ([transport] backend = "nccl") with the keys it adds
// to [transport] (custom_all_reduce, custom_all_reduce_force_fail, env).
#include "kiln/plugin.h"
#include "nccl_collective.h"
#include "transport_settings.h"

namespace kiln::nccl {
namespace {

Status register_nccl(Registrar& registrar) {
  return registrar.add<Collective>(
      "nccl",
      "NCCL between GPU ranks (one process per GPU; rank and rendezvous from RANK, WORLD_SIZE, MASTER_ADDR, "
      "MASTER_PORT) with a probed CUDA-IPC custom all-reduce",
      &cuda::create_nccl_collective, DeviceSet::cuda(), transport_schema());
}

}  // namespace
}  // namespace kiln::nccl

KILN_PLUGIN("transport-nccl", "0.1.0", "collectives between GPUs over NCCL, with a custom CUDA-IPC all-reduce",
            kiln::nccl::register_nccl)
