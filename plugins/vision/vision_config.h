// glm5_next's vision tower configuration (`vision_config` in config.json, transformers 5.17's Glm5NextVisionConfig)
// and the prompt tokens an image becomes (the top-level image token ids).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "kiln/status.h"

namespace kiln::vision {

struct VisionConfig {
  int64_t depth = 24;
  int64_t hidden_size = 1024;
  int64_t num_heads = 16;
  int64_t intermediate_size = 4096;
  int64_t out_hidden_size = 1536;
  int64_t projection_intermediate_size = 10240;
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  bool attention_bias = true;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  double swiglu_limit = 10.0;
  // Prompt tokens: <|begin_of_image|>, <|image|> (one per merged embedding), <|end_of_image|>.
  int32_t image_start_token_id = 154830;
  int32_t image_token_id = 154854;
  int32_t image_end_token_id = 154831;
  // The text model's width, which the merged embeddings must have.
  int64_t text_hidden_size = 0;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
};

// Parses config.json (the whole file); errors say which field is wrong and why.
Result<VisionConfig> parse_vision_config(const nlohmann::json& config);

}  // namespace kiln::vision
