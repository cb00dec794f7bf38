// Architecture `glm4_moe_lite` (see glm4_moe_lite.cpp).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/arch/architecture.h"

namespace kiln::arch {

Result<std::unique_ptr<Architecture>> parse_glm4_moe_lite(const nlohmann::json& config, const std::string& source);

}  // namespace kiln::arch
