// glm5_next on the CPU as a ModelInstance (HostModelInstance over Glm5NextModel), alone or as tensor-parallel ranks
// (the MLA/MoE family's two ways: threads of this process, or one process per rank).
#pragma once

#include <memory>

#include "model/arch/glm5_next/glm5_next_model.h"
#include "model/host_model_instance.h"
#include "model/model_instance.h"

namespace kiln::glm5_next {

class Glm5NextCpuInstance final : public HostModelInstance<Glm5NextModel> {
 public:
  static Result<std::unique_ptr<Glm5NextCpuInstance>> create(const Glm5NextConfig& config, const BuildContext& ctx);
  // ctx.tensor_parallel ranks as threads of this process (TensorParallelInstance), each with its part of the weights
  // (Glm5NextShardedSource), sharing one set of KV pages and state slots; with ctx.decode_context = D > 1 the ranks
  // also meet in groups of D consecutive ranks that split the DSA layers' paged caches by token.
  static Result<std::unique_ptr<ModelInstance>> create_tensor_parallel(const Glm5NextConfig& config,
                                                                       const BuildContext& ctx);
  // This process's rank of ctx.tensor_parallel ranks in as many processes (parallel/rank_processes.h): its part of the
  // weights, the group ctx.collective (and ctx.context_collective, its decode-context group), and caches of its own
  // (every rank writes the rows and state it reads).
  static Result<std::unique_ptr<ModelInstance>> create_process_rank(const Glm5NextConfig& config,
                                                                    const BuildContext& ctx);

 private:
  using HostModelInstance::HostModelInstance;
  static Result<std::unique_ptr<Glm5NextCpuInstance>> create_rank(const Glm5NextConfig& config, const BuildContext& ctx,
                                                                  TensorShard shard, Collective* context_group);
};

}  // namespace kiln::glm5_next
