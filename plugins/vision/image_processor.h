// The glm5_next image processor end to end for one decoded image (transformers 5.17, Glm5NextImageProcessor on
// its default torchvision backend): plan the canvas, resize the content with antialiased bicubic, pad zeros
// bottom/right, normalise, patchify.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "image_canvas.h"
#include "kiln/status.h"
#include "rgb_image.h"

namespace kiln::vision {

struct ProcessedImage {
  std::vector<float> pixel_values;    // [num_patches, patch_dim] row-major
  std::array<int64_t, 3> grid_thw{};  // {1, canvas_h / patch, canvas_w / patch}
  CanvasPlan plan;
  int64_t num_patches() const { return grid_thw[0] * grid_thw[1] * grid_thw[2]; }
  // LLM tokens the image becomes after the merge (grid_h · grid_w / merge²).
  int64_t num_tokens(const ImageProcessorConfig& config) const {
    return num_patches() / (config.merge_size * config.merge_size);
  }
};

// The uint8 canvas: the image resized to the plan's content size, then zero padded to the canvas.
RgbImage build_canvas(const RgbImage& image, const CanvasPlan& plan);

Result<ProcessedImage> process_image(const RgbImage& image, const ImageProcessorConfig& config = {});

}  // namespace kiln::vision
