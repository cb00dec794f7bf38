#include "model/mla_moe_cpu_instance.h"

namespace kiln {

Result<std::unique_ptr<MlaMoeCpuInstance>> MlaMoeCpuInstance::create(const ModelConfig& config, const BuildContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ModelWeights weights,
                        load_model_weights(config, *ctx.source, *ctx.format, ctx.load_mtp, ctx.precision));
  auto model = std::make_unique<MlaMoeModel>(config, std::move(weights));
  model->set_threads(ctx.threads);
  model->set_collective(ctx.collective);
  return std::unique_ptr<MlaMoeCpuInstance>(new MlaMoeCpuInstance(std::move(model), *ctx.device));
}

}  // namespace kiln
