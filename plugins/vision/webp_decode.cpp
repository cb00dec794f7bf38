// WebP through libwebp: the header's features first (size, animation), then the still image straight into RGB.
// libwebp's RGB mode drops alpha, which is what PIL's convert("RGB") and torchvision's RGB mode do with it.
#include <webp/decode.h>

#include <string>

#include "image_decoders.h"

namespace kiln::vision {

Result<RgbImage> decode_webp(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  WebPBitstreamFeatures features;
  const VP8StatusCode header = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (header != VP8_STATUS_OK)
    return invalid_argument("corrupt WebP (header: libwebp status " + std::to_string(static_cast<int>(header)) + ")");
  if (features.has_animation) return invalid_argument("animated WebP is not supported (a still image is expected)");
  KILN_RETURN_IF_ERROR(
      check_dimensions(static_cast<uint64_t>(features.height), static_cast<uint64_t>(features.width), limits, "WebP"));
  RgbImage image;
  image.height = features.height;
  image.width = features.width;
  image.pixels.resize(static_cast<size_t>(image.height * image.width * 3));
  const int stride = features.width * 3;
  if (WebPDecodeRGBInto(bytes.data(), bytes.size(), image.pixels.data(), image.pixels.size(), stride) == nullptr)
    return invalid_argument("corrupt WebP (the image data does not decode)");
  return image;
}

}  // namespace kiln::vision
