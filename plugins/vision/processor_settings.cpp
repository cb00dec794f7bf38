#include "processor_settings.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace kiln::vision {
namespace {

Status read_int(const nlohmann::json& j, const char* key, int64_t& out) {
  if (!j.contains(key) || j[key].is_null()) return ok_status();
  if (!j[key].is_number_integer())
    return invalid_argument(std::string("preprocessor_config.json: ") + key + " must be an integer");
  out = j[key].get<int64_t>();
  return ok_status();
}

Status read_triple(const nlohmann::json& j, const char* key, float out[3]) {
  if (!j.contains(key) || j[key].is_null()) return ok_status();
  const nlohmann::json& v = j[key];
  if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() || !v[2].is_number())
    return invalid_argument(std::string("preprocessor_config.json: ") + key + " must be three numbers (R, G, B)");
  for (int c = 0; c < 3; ++c) out[c] = static_cast<float>(v[c].get<double>());
  return ok_status();
}

// A step kiln always takes: refused when the file switches it off.
Status require_on(const nlohmann::json& j, const char* key) {
  if (j.contains(key) && j[key].is_boolean() && !j[key].get<bool>())
    return unimplemented(std::string("preprocessor_config.json sets ") + key +
                         " = false; kiln's glm5_next processor always applies it");
  return ok_status();
}

Status must_match(const char* key, int64_t processor, int64_t tower) {
  if (processor == tower) return ok_status();
  return invalid_argument(std::string("preprocessor_config.json: ") + key + " " + std::to_string(processor) +
                          " differs from the vision tower's " + std::to_string(tower) + " (config.json vision_config)");
}

}  // namespace

Result<ImageProcessorConfig> processor_settings(const std::filesystem::path& dir, const VisionConfig& vision) {
  ImageProcessorConfig p;
  p.patch_size = vision.patch_size;
  p.temporal_patch_size = vision.temporal_patch_size;
  p.merge_size = vision.spatial_merge_size;
  const std::filesystem::path file = dir / "preprocessor_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return p;
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object()) return invalid_argument(file.string() + " is not a JSON object");
  for (const char* key : {"do_resize", "do_rescale", "do_normalize", "do_convert_rgb"})
    KILN_RETURN_IF_ERROR(require_on(j, key));
  if (j.contains("rescale_factor") && j["rescale_factor"].is_number() &&
      std::abs(j["rescale_factor"].get<double>() - 1.0 / 255.0) > 1e-12)
    return unimplemented("preprocessor_config.json: rescale_factor " + j["rescale_factor"].dump() +
                         "; kiln's processor rescales by 1/255");
  if (j.contains("resample") && j["resample"].is_number_integer() && j["resample"].get<int>() != 3)
    return unimplemented("preprocessor_config.json: resample " + j["resample"].dump() +
                         "; kiln's processor resizes bicubic (3) only");
  KILN_RETURN_IF_ERROR(read_int(j, "patch_size", p.patch_size));
  KILN_RETURN_IF_ERROR(read_int(j, "temporal_patch_size", p.temporal_patch_size));
  KILN_RETURN_IF_ERROR(read_int(j, "merge_size", p.merge_size));
  KILN_RETURN_IF_ERROR(must_match("patch_size", p.patch_size, vision.patch_size));
  KILN_RETURN_IF_ERROR(must_match("temporal_patch_size", p.temporal_patch_size, vision.temporal_patch_size));
  KILN_RETURN_IF_ERROR(must_match("merge_size", p.merge_size, vision.spatial_merge_size));
  KILN_RETURN_IF_ERROR(read_int(j, "min_image_tokens", p.min_image_tokens));
  KILN_RETURN_IF_ERROR(read_int(j, "max_image_tokens", p.max_image_tokens));
  if (p.min_image_tokens < 1 || p.max_image_tokens < p.min_image_tokens)
    return invalid_argument("preprocessor_config.json: min_image_tokens " + std::to_string(p.min_image_tokens) +
                            " and max_image_tokens " + std::to_string(p.max_image_tokens) +
                            " must satisfy 1 <= min <= max");
  KILN_RETURN_IF_ERROR(read_triple(j, "image_mean", p.image_mean));
  KILN_RETURN_IF_ERROR(read_triple(j, "image_std", p.image_std));
  for (float s : p.image_std)
    if (!(s > 0.0f)) return invalid_argument("preprocessor_config.json: image_std must be positive");
  return p;
}

}  // namespace kiln::vision
