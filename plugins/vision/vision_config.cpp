#include "vision_config.h"

namespace kiln::vision {
namespace {

template <class T>
Status read_field(const nlohmann::json& j, const char* key, T& out) {
  if (!j.contains(key) || j[key].is_null()) return ok_status();  // the default
  const nlohmann::json& v = j[key];
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return invalid_argument(std::string("vision_config.") + key + " must be true or false");
    out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) return invalid_argument(std::string("vision_config.") + key + " must be an integer");
    out = v.get<T>();
  } else {
    if (!v.is_number()) return invalid_argument(std::string("vision_config.") + key + " must be a number");
    out = v.get<T>();
  }
  return ok_status();
}

// patch_size / temporal_patch_size may be given as [n, n] (transformers accepts a list); the tower is square.
Status read_size(const nlohmann::json& j, const char* key, int64_t& out) {
  if (j.contains(key) && j[key].is_array()) {
    const nlohmann::json& a = j[key];
    if (a.empty() || !a[0].is_number_integer())
      return invalid_argument(std::string("vision_config.") + key + " must be an integer or a list of them");
    for (const auto& v : a)
      if (v != a[0]) return unimplemented(std::string("vision_config.") + key + " with unequal sides is not supported");
    out = a[0].get<int64_t>();
    return ok_status();
  }
  return read_field(j, key, out);
}

}  // namespace

Result<VisionConfig> parse_vision_config(const nlohmann::json& config) {
  if (!config.is_object()) return invalid_argument("config.json is not a JSON object");
  const std::string type =
      config.contains("model_type") && config["model_type"].is_string() ? config["model_type"].get<std::string>() : "";
  if (type != "glm5_next")
    return failed_precondition("the image modality runs glm5_next's vision tower; this checkpoint is `" + type + "`");
  if (!config.contains("vision_config") || !config["vision_config"].is_object())
    return failed_precondition("config.json has no vision_config: this checkpoint has no vision tower");
  const nlohmann::json& v = config["vision_config"];
  VisionConfig c;
  KILN_RETURN_IF_ERROR(read_field(v, "depth", c.depth));
  KILN_RETURN_IF_ERROR(read_field(v, "hidden_size", c.hidden_size));
  KILN_RETURN_IF_ERROR(read_field(v, "num_heads", c.num_heads));
  KILN_RETURN_IF_ERROR(read_field(v, "intermediate_size", c.intermediate_size));
  KILN_RETURN_IF_ERROR(read_field(v, "out_hidden_size", c.out_hidden_size));
  KILN_RETURN_IF_ERROR(read_field(v, "projection_intermediate_size", c.projection_intermediate_size));
  KILN_RETURN_IF_ERROR(read_field(v, "in_channels", c.in_channels));
  KILN_RETURN_IF_ERROR(read_size(v, "patch_size", c.patch_size));
  KILN_RETURN_IF_ERROR(read_size(v, "temporal_patch_size", c.temporal_patch_size));
  KILN_RETURN_IF_ERROR(read_field(v, "spatial_merge_size", c.spatial_merge_size));
  KILN_RETURN_IF_ERROR(read_field(v, "attention_bias", c.attention_bias));
  KILN_RETURN_IF_ERROR(read_field(v, "rms_norm_eps", c.rms_norm_eps));
  KILN_RETURN_IF_ERROR(read_field(v, "swiglu_limit", c.swiglu_limit));
  if (v.contains("hidden_act") && !v["hidden_act"].is_string())
    return invalid_argument("vision_config.hidden_act must be a string, got " + v["hidden_act"].dump());
  const std::string act = v.value("hidden_act", "silu");
  if (act != "silu") return unimplemented("vision_config.hidden_act `" + act + "`: the tower implements silu");
  if (v.contains("rope_parameters") && v["rope_parameters"].is_object()) {
    const nlohmann::json& rope = v["rope_parameters"];
    if (rope.contains("rope_type") && !rope["rope_type"].is_string())
      return invalid_argument("vision_config.rope_parameters.rope_type must be a string, got " + rope["rope_type"].dump());
    const std::string rope_type = rope.value("rope_type", "axial");
    if (rope_type != "axial")
      return unimplemented("vision_config.rope_parameters.rope_type `" + rope_type + "`: glm5_next's tower is axial");
    KILN_RETURN_IF_ERROR(read_field(rope, "rope_theta", c.rope_theta));
  }
  if (c.depth < 0 || c.hidden_size <= 0 || c.num_heads <= 0 || c.intermediate_size <= 0 || c.out_hidden_size <= 0 ||
      c.projection_intermediate_size <= 0 || c.in_channels <= 0 || c.patch_size <= 0 || c.temporal_patch_size <= 0 ||
      c.spatial_merge_size <= 0)
    return invalid_argument("vision_config: sizes must be positive (depth at least 0)");
  if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0)
    return invalid_argument("vision_config: hidden_size " + std::to_string(c.hidden_size) + " / num_heads " +
                            std::to_string(c.num_heads) +
                            " must be a head width divisible by 4 (the axial RoPE gives each axis a quarter)");
  KILN_RETURN_IF_ERROR(read_field(config, "image_start_token_id", c.image_start_token_id));
  KILN_RETURN_IF_ERROR(read_field(config, "image_token_id", c.image_token_id));
  KILN_RETURN_IF_ERROR(read_field(config, "image_end_token_id", c.image_end_token_id));
  const nlohmann::json& text =
      config.contains("text_config") && config["text_config"].is_object() ? config["text_config"] : config;
  KILN_RETURN_IF_ERROR(read_field(text, "hidden_size", c.text_hidden_size));
  return c;
}

}  // namespace kiln::vision
