// Architecture `glm_moe_dsa` (see glm_moe_dsa.cpp).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/arch/architecture.h"

namespace kiln::arch {

Result<std::unique_ptr<Architecture>> parse_glm_moe_dsa(const nlohmann::json& config, const std::string& source);

}  // namespace kiln::arch
