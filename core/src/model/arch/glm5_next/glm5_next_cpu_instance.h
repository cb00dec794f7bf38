// glm5_next on the CPU as a ModelInstance (HostModelInstance over Glm5NextModel).
#pragma once

#include <memory>

#include "model/arch/glm5_next/glm5_next_model.h"
#include "model/host_model_instance.h"

namespace kiln::glm5_next {

class Glm5NextCpuInstance final : public HostModelInstance<Glm5NextModel> {
 public:
  static Result<std::unique_ptr<Glm5NextCpuInstance>> create(const Glm5NextConfig& config, const BuildContext& ctx);

 private:
  using HostModelInstance::HostModelInstance;
};

}  // namespace kiln::glm5_next
