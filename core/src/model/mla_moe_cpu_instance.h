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

 private:
  using HostModelInstance::HostModelInstance;
  static Result<std::unique_ptr<MlaMoeCpuInstance>> create_rank(const ModelConfig& config, const BuildContext& ctx,
                                                                const WeightSource& source, TensorShard shard,
                                                                Collective* context_group);
};

}  // namespace kiln
