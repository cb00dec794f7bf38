// Architecture `deepseek_v3` (see deepseek_v3.cpp).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/arch/architecture.h"

namespace kiln::arch {

Result<std::unique_ptr<Architecture>> parse_deepseek_v3(const nlohmann::json& config, const std::string& source);

}  // namespace kiln::arch
