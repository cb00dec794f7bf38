// glm5_next's vision tower on the CPU in fp32 (transformers 5.17's Glm5NextVisionModel, facts in
// shared/specs/glm5-next.md §4): patch embedding, 2D axial RoPE, pre-norm blocks with q/k RMSNorm and a clamped
// SwiGLU, post-norm, the 2×2 downsample and the merger — one embedding per LLM token.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/status.h"
#include "vision_config.h"
#include "vision_weights.h"

namespace kiln::vision {

// pixel_values [Σ t·h·w, patch_dim] for the images (or videos) `grids` (t, h, w in patches), in the processor's
// patch order; returns [Σ t·h·w / merge², out_hidden], each image's rows in order. Each frame attends within
// itself only. Errors: a grid that is empty or not divisible into merge blocks, or a size mismatch.
Result<std::vector<float>> run_vision_tower(const VisionConfig& config, const VisionWeights& weights,
                                            std::span<const float> pixel_values,
                                            std::span<const std::array<int64_t, 3>> grids);

}  // namespace kiln::vision
