// The arithmetic follows the reference step by step in doubles, the way Python evaluates it (true division of
// integers is correctly rounded in both), so the canvas and content sizes are the reference's to the pixel.
#include "image_canvas.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kiln::vision {
namespace {

int64_t align_up(int64_t value, int64_t factor) {
  return (value + factor - 1) / factor * factor;
}

}  // namespace

Result<CanvasPlan> plan_canvas(int64_t height, int64_t width, const ImageProcessorConfig& config) {
  if (height <= 0 || width <= 0)
    return invalid_argument("image of size " + std::to_string(width) + "×" + std::to_string(height) + " is empty");
  const int64_t factor = config.factor();
  const int64_t frames = config.temporal_patch_size;  // a still image is repeated over the temporal patch
  const int64_t pixels_per_token = frames * factor * factor;
  const int64_t min_pixels = config.min_image_tokens * pixels_per_token;
  const int64_t max_pixels = config.max_image_tokens * pixels_per_token;
  // The reference passes num_frames = temporal_patch_size for an image: exactly one temporal group.
  const int64_t aligned_frames = frames;

  int64_t canvas_height = align_up(height, factor);
  int64_t canvas_width = align_up(width, factor);
  int64_t budget = aligned_frames * canvas_height * canvas_width;
  if (budget < min_pixels) {
    const double scale = std::sqrt(static_cast<double>(min_pixels) / static_cast<double>(frames * height * width));
    canvas_height = align_up(std::max<int64_t>(1, static_cast<int64_t>(std::ceil(height * scale))), factor);
    canvas_width = align_up(std::max<int64_t>(1, static_cast<int64_t>(std::ceil(width * scale))), factor);
    budget = aligned_frames * canvas_height * canvas_width;
  }
  if (budget > max_pixels) {
    if (max_pixels < aligned_frames * factor * factor)
      return invalid_argument("max_image_tokens " + std::to_string(config.max_image_tokens) +
                              " cannot hold one aligned patch");
    // The largest content height whose aligned canvas fits the budget, width following the aspect ratio.
    int64_t low = 1, high = height;
    int64_t best_height = factor, best_width = factor;
    while (low <= high) {
      const int64_t content_height = (low + high) / 2;
      const int64_t content_width = std::max<int64_t>(
          1,
          static_cast<int64_t>(std::floor(static_cast<double>(width * content_height) / static_cast<double>(height))));
      const int64_t candidate_height = align_up(content_height, factor);
      const int64_t candidate_width = align_up(content_width, factor);
      if (aligned_frames * candidate_height * candidate_width <= max_pixels) {
        best_height = candidate_height;
        best_width = candidate_width;
        low = content_height + 1;
      } else {
        high = content_height - 1;
      }
    }
    canvas_height = best_height;
    canvas_width = best_width;
  }

  // Fit without stretching: shrink to the canvas, never enlarge unless the image is below the minimum budget.
  double scale = std::min(static_cast<double>(canvas_height) / static_cast<double>(height),
                          static_cast<double>(canvas_width) / static_cast<double>(width));
  if (frames * height * width >= min_pixels) scale = std::min(1.0, scale);
  CanvasPlan plan;
  plan.canvas_height = canvas_height;
  plan.canvas_width = canvas_width;
  plan.content_height = std::max<int64_t>(1, std::min(canvas_height, static_cast<int64_t>(std::floor(height * scale))));
  plan.content_width = std::max<int64_t>(1, std::min(canvas_width, static_cast<int64_t>(std::floor(width * scale))));
  return plan;
}

}  // namespace kiln::vision
