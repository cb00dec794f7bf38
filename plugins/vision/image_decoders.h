// One decoder per container (png_decode.cpp, jpeg_decode.cpp, webp_decode.cpp); image_decode.cpp picks one.
// Each checks the header's dimensions with check_dimensions before allocating the pixels.
#pragma once

#include <cstdint>
#include <span>

#include "image_decode.h"

namespace kiln::vision {

Status check_dimensions(uint64_t height, uint64_t width, const DecodeLimits& limits, const char* format);

Result<RgbImage> decode_png(std::span<const uint8_t> bytes, const DecodeLimits& limits);
Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits);
Result<RgbImage> decode_webp(std::span<const uint8_t> bytes, const DecodeLimits& limits);

}  // namespace kiln::vision
