// Image bytes (PNG, JPEG, WebP or anything else) → plugins/vision's decode_image through libpng, libjpeg-turbo and
// libwebp, then, for images it accepts, the glm5_next processor (canvas, antialiased bicubic, patchify). Corrupt,
// truncated or hostile files must come back as a Status; what decodes must be a consistent RGB8 image.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_support.h"
#include "image_decode.h"
#include "image_processor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  // Limits small enough that one input decodes in milliseconds; the decoders' checks are the same at any limit.
  vision::DecodeLimits limits;
  limits.max_pixels = 1 << 20;
  limits.max_side = 4096;
  auto image = vision::decode_image(std::span<const uint8_t>(data, size), limits);
  if (!image.ok()) {
    fuzz::check(!image.status().message().empty(), "a refused image says why");
    return 0;
  }
  fuzz::check(image->height > 0 && image->width > 0, "a decoded image is not empty");
  fuzz::check(image->pixels.size() == static_cast<size_t>(image->height * image->width * 3), "RGB8 buffer size");
  auto processed = vision::process_image(*image);
  fuzz::check(processed.ok(), "every decoded image can be processed");
  fuzz::check(processed->pixel_values.size() == static_cast<size_t>(processed->num_patches() * 1176),
              "pixel_values hold 1176 values per patch");
  fuzz::check(processed->grid_thw[1] % 2 == 0 && processed->grid_thw[2] % 2 == 0, "grid is whole merge blocks");
  return 0;
}
