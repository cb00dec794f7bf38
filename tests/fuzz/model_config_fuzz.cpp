// A config.json → ModelConfig::from_json (architecture, dimensions, rope scaling, legacy aliases). Errors are
// Statuses; nothing may crash or throw.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const auto json = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  auto config = ModelConfig::from_json(json, "config.json");
  if (config.ok()) (void)config->to_model_info();
  return 0;
}
