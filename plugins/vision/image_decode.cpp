#include "image_decode.h"

#include <cstring>
#include <string>

#include "image_decoders.h"

namespace kiln::vision {

ImageFormat sniff_image_format(std::span<const uint8_t> bytes) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return ImageFormat::kPng;
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) return ImageFormat::kJpeg;
  if (bytes.size() >= 12 && std::memcmp(bytes.data(), "RIFF", 4) == 0 && std::memcmp(bytes.data() + 8, "WEBP", 4) == 0)
    return ImageFormat::kWebp;
  return ImageFormat::kUnknown;
}

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

Status check_dimensions(uint64_t height, uint64_t width, const DecodeLimits& limits, const char* format) {
  const std::string size = std::to_string(width) + "×" + std::to_string(height);
  if (height == 0 || width == 0) return invalid_argument(std::string(format) + " image of size " + size + " is empty");
  if (height > limits.max_side || width > limits.max_side)
    return invalid_argument(std::string(format) + " image of " + size + " pixels exceeds the largest side allowed (" +
                            std::to_string(limits.max_side) + ")");
  if (height * width > limits.max_pixels)
    return invalid_argument(std::string(format) + " image of " + size + " pixels exceeds the limit of " +
                            std::to_string(limits.max_pixels) + " pixels");
  return ok_status();
}

Result<RgbImage> decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  if (bytes.size() > limits.max_bytes)
    return invalid_argument("encoded image of " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
                            std::to_string(limits.max_bytes) + " bytes");
  switch (sniff_image_format(bytes)) {
    case ImageFormat::kPng:
      return decode_png(bytes, limits);
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes, limits);
    case ImageFormat::kWebp:
      return decode_webp(bytes, limits);
    case ImageFormat::kUnknown:
      break;
  }
  return invalid_argument("not a PNG, JPEG or WebP");
}

}  // namespace kiln::vision
