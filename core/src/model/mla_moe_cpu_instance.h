// The MLA + MoE family on the CPU as a ModelInstance (HostModelInstance over MlaMoeModel).
#pragma once

#include <memory>

#include "model/host_model_instance.h"
#include "model/mla_moe_model.h"

namespace kiln {

class MlaMoeCpuInstance final : public HostModelInstance<MlaMoeModel> {
 public:
  static Result<std::unique_ptr<MlaMoeCpuInstance>> create(const ModelConfig& config, const BuildContext& ctx);
  // ctx.tensor_parallel ranks as threads of this process, each with its part of the weights (ShardedWeightSource),
  // in decode-context groups of ctx.decode_context ranks that split the KV by token.
  static Result<std::unique_ptr<ModelInstance>> create_tensor_parallel(const ModelConfig& config,
                                                                       const BuildContext& ctx);
  // This process's rank of ctx.tensor_parallel ranks in as many processes (parallel/rank_processes.h): its part of
  // the weights, the group ctx.collective (world size ctx.tensor_parallel), its decode-context group
  // ctx.context_collective, and a KV pool of its own (every rank writes its rows: MlaMoeModel::set_private_cache).
  static Result<std::unique_ptr<ModelInstance>> create_process_rank(const ModelConfig& config, const BuildContext& ctx);

 private:
  using HostModelInstance::HostModelInstance;
  static Result<std::unique_ptr<MlaMoeCpuInstance>> create_rank(const ModelConfig& config, const BuildContext& ctx,
                                                                const WeightSource& source, TensorShard shard,
                                                                Collective* context_group);
  std::unique_ptr<WeightSource> rank_source_;  // a process rank's sharded view of the checkpoint
};

}  // namespace kiln
