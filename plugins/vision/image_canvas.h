// Where an image lands in the glm5_next processor (transformers 5.17, Glm5NextImageProcessor.resize and
// smart_resize): a canvas of multiples of `factor` (28) holding between min and max image tokens, and the
// aspect-preserving content size the image is resized to before zero padding fills the canvas bottom/right.
#pragma once

#include <cstdint>

#include "kiln/status.h"

namespace kiln::vision {

struct ImageProcessorConfig {
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  int64_t min_image_tokens = 16;
  int64_t max_image_tokens = 8000;
  // OPENAI_CLIP_MEAN / OPENAI_CLIP_STD, rescale 1/255 (fused into mean·255, std·255 as transformers does).
  float image_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  float image_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};

  int64_t factor() const { return patch_size * merge_size; }
};

struct CanvasPlan {
  int64_t canvas_height = 0;  // multiples of factor
  int64_t canvas_width = 0;
  int64_t content_height = 0;  // the resized image, top-left; the rest is zero
  int64_t content_width = 0;
};

// invalid_argument when the budget cannot hold one aligned patch (max tokens too small for the factor).
Result<CanvasPlan> plan_canvas(int64_t height, int64_t width, const ImageProcessorConfig& config);

}  // namespace kiln::vision
