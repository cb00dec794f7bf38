#include "model/arch/architecture.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace kiln {

const ArchitectureEntry* find_architecture(const std::string& model_type) {
  for (const ArchitectureEntry& e : architectures())
    if (model_type == e.model_type) return &e;
  return nullptr;
}

std::string architecture_names() {
  std::string s;
  for (const ArchitectureEntry& e : architectures()) s += (s.empty() ? "" : ", ") + std::string(e.model_type);
  return s;
}

Result<std::unique_ptr<Architecture>> parse_architecture(const nlohmann::json& config, const std::string& source) {
  if (!config.is_object()) return invalid_argument(source + ": config must be a JSON object");
  if (!config.contains("model_type"))
    return invalid_argument(source + ": no 'model_type' field; supported: " + architecture_names());
  if (!config.at("model_type").is_string())
    return invalid_argument(source + ": field 'model_type' must be a string, got " + config.at("model_type").dump());
  const std::string type = config.at("model_type").get<std::string>();
  const ArchitectureEntry* e = find_architecture(type);
  if (!e) return unimplemented(source + ": model_type '" + type + "' is not supported; supported: " + architecture_names());
  return e->parse(config, source);
}

Result<std::unique_ptr<Architecture>> load_architecture(const std::filesystem::path& config_json) {
  std::ifstream in(config_json);
  if (!in) return not_found("cannot read model config " + config_json.string());
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(config_json.string() + ": not valid JSON: " + e.what());
  }
  return parse_architecture(parsed, config_json.string());
}

}  // namespace kiln
