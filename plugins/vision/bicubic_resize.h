// Antialiased bicubic resize of 8-bit RGB, bit-exact to what transformers 5.17's default (torchvision) glm5_next
// processor gets on the CPU: torchvision's resize(BICUBIC, antialias=True) on a uint8 tensor runs ATen's native
// uint8 path (_upsample_bicubic2d_aa, the Pillow-SIMD scheme): separable, horizontal pass then vertical pass
// with a uint8 intermediate; per axis, Keys cubic weights (a = −0.5) stretched by the scale when shrinking,
// normalised in double, quantised to int16 with a precision chosen from the largest weight, accumulated in
// integers with a rounding half, shifted and clamped to 0..255.
#pragma once

#include <cstdint>

#include "rgb_image.h"

namespace kiln::vision {

RgbImage resize_bicubic_antialias(const RgbImage& image, int64_t out_height, int64_t out_width);

}  // namespace kiln::vision
