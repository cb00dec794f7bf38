// The zero-padded canvas → pixel_values [grid_h·grid_w, 3·T·p·p] as transformers 5.17's Glm5NextImageProcessor
// lays them out: normalised (x − 255·mean) / (255·std) in float32 (rescale fused into mean/std, as the
// torchvision backend does), each patch ordered (C, T, p, p) with the still image repeated over T, and patches
// ordered row-block, column-block, inner row, inner column so that every merge² consecutive patches form one
// merge block.
#pragma once

#include <cstdint>
#include <vector>

#include "image_canvas.h"
#include "rgb_image.h"

namespace kiln::vision {

// float32(float32(mean) · 255) and likewise for std: the constants the reference normalises with.
void fused_normalization(const ImageProcessorConfig& config, float mean255[3], float std255[3]);

// canvas: the resized image padded with zeros to multiples of patch_size · merge_size.
std::vector<float> patchify(const RgbImage& canvas, const ImageProcessorConfig& config);

}  // namespace kiln::vision
