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
// The tower's input checked: every grid a whole number of merge blocks, pixel_values sized for them. Returns the
// number of patches.
Result<int64_t> check_tower_input(const VisionConfig& config, size_t pixel_values,
                                  std::span<const std::array<int64_t, 3>> grids);

// Each patch's (row, column) in its frame, in the processor's patch order, and each frame's patch count (the
// segments attention stays within).
void patch_positions(std::span<const std::array<int64_t, 3>> grids, int64_t merge, std::vector<int64_t>& rows,
                     std::vector<int64_t>& cols, std::vector<int64_t>& segments);

// The 2D axial RoPE tables cos / sin [n, head_dim] of those positions (fp32, as the reference computes them).
void axial_rope_tables(const VisionConfig& config, const std::vector<int64_t>& rows, const std::vector<int64_t>& cols,
                       std::vector<float>& cos_t, std::vector<float>& sin_t);

Result<std::vector<float>> run_vision_tower(const VisionConfig& config, const VisionWeights& weights,
                                            std::span<const float> pixel_values,
                                            std::span<const std::array<int64_t, 3>> grids);

}  // namespace kiln::vision
