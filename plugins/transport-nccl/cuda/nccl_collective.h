// The `nccl` collective: one process per GPU, an NCCL communicator per process built from the launch environment
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with the unique id served by rank 0 over the TCP bootstrap, and the
// custom all-reduce where the probe chose it. Every call is enqueued on the caller's stream, allocates nothing and
// syncs nothing, so the engine can capture it in a CUDA graph.
#pragma once

#include <memory>

#include "kiln/collective.h"
#include "kiln/plugin.h"

namespace kiln::nccl::cuda {

Result<std::unique_ptr<Collective>> create_nccl_collective(const CreateContext& context);

}  // namespace kiln::nccl::cuda
