#include "model/arch/glm5_next/glm5_next_cpu_instance.h"

namespace kiln::glm5_next {

Result<std::unique_ptr<Glm5NextCpuInstance>> Glm5NextCpuInstance::create(const Glm5NextConfig& config,
                                                                         const BuildContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Glm5NextWeights weights,
                        load_glm5_next_weights(config, *ctx.source, *ctx.format, ctx.load_mtp, ctx.precision));
  auto model = std::make_unique<Glm5NextModel>(config, std::move(weights));
  model->set_precision(ctx.precision);
  model->set_threads(ctx.threads);
  return std::unique_ptr<Glm5NextCpuInstance>(new Glm5NextCpuInstance(std::move(model), *ctx.device));
}

}  // namespace kiln::glm5_next
