#include "patchify.h"

namespace kiln::vision {

void fused_normalization(const ImageProcessorConfig& config, float mean255[3], float std255[3]) {
  // torch multiplies a float32 tensor by the Python scalar 1 / (1/255) = 255.0 in float32.
  for (int c = 0; c < 3; ++c) {
    mean255[c] = config.image_mean[c] * 255.0f;
    std255[c] = config.image_std[c] * 255.0f;
  }
}

std::vector<float> patchify(const RgbImage& canvas, const ImageProcessorConfig& config) {
  float mean255[3], std255[3];
  fused_normalization(config, mean255, std255);
  // Every byte value normalises to one float per channel; a table keeps the (x − m) / s arithmetic exact.
  float table[3][256];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) table[c][v] = (static_cast<float>(v) - mean255[c]) / std255[c];

  const int64_t p = config.patch_size, merge = config.merge_size, t = config.temporal_patch_size;
  const int64_t grid_h = canvas.height / p, grid_w = canvas.width / p;
  const int64_t patch_dim = 3 * t * p * p;
  std::vector<float> out(static_cast<size_t>(grid_h * grid_w * patch_dim));
  float* dst = out.data();
  for (int64_t row_block = 0; row_block < grid_h / merge; ++row_block)
    for (int64_t col_block = 0; col_block < grid_w / merge; ++col_block)
      for (int64_t inner_row = 0; inner_row < merge; ++inner_row)
        for (int64_t inner_col = 0; inner_col < merge; ++inner_col) {
          const int64_t y0 = (row_block * merge + inner_row) * p;
          const int64_t x0 = (col_block * merge + inner_col) * p;
          for (int c = 0; c < 3; ++c)
            for (int64_t frame = 0; frame < t; ++frame)
              for (int64_t y = 0; y < p; ++y)
                for (int64_t x = 0; x < p; ++x) *dst++ = table[c][canvas.at(y0 + y, x0 + x, c)];
        }
  return out;
}

}  // namespace kiln::vision
