#include "image_processor.h"

#include <algorithm>

#include "bicubic_resize.h"
#include "patchify.h"

namespace kiln::vision {

RgbImage build_canvas(const RgbImage& image, const CanvasPlan& plan) {
  const RgbImage content = resize_bicubic_antialias(image, plan.content_height, plan.content_width);
  RgbImage canvas;
  canvas.height = plan.canvas_height;
  canvas.width = plan.canvas_width;
  canvas.pixels.assign(static_cast<size_t>(canvas.height * canvas.width * 3), 0);
  const size_t row_bytes = static_cast<size_t>(content.width * 3);
  for (int64_t y = 0; y < content.height; ++y)
    std::copy_n(&content.pixels[static_cast<size_t>(y) * row_bytes], row_bytes,
                &canvas.pixels[static_cast<size_t>(y * canvas.width * 3)]);
  return canvas;
}

Result<ProcessedImage> process_image(const RgbImage& image, const ImageProcessorConfig& config) {
  ProcessedImage processed;
  KILN_ASSIGN_OR_RETURN(processed.plan, plan_canvas(image.height, image.width, config));
  const RgbImage canvas = build_canvas(image, processed.plan);
  processed.pixel_values = patchify(canvas, config);
  processed.grid_thw = {1, canvas.height / config.patch_size, canvas.width / config.patch_size};
  return processed;
}

}  // namespace kiln::vision
