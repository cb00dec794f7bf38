// PNG, JPEG and WebP bytes → RgbImage through Debian's libpng, libjpeg-turbo and libwebp (never a hand-written
// decoder), converted to RGB8 the way transformers 5.17 sees the image:
//  - alpha is dropped, not composited (PIL convert("RGB") and torchvision decode_image(mode=RGB) both drop it);
//  - palette, grayscale (1/2/4/8-bit) and gray+alpha become RGB; 16-bit RGB(A) and gray+alpha keep the high
//    byte, 16-bit gray is clipped to 255 (PIL's I;16 → RGB; torchvision would hand the processor uint16);
//  - CMYK/YCCK JPEGs convert as PIL does (samples read as Adobe-inverted, its cmyk2rgb);
//  - EXIF orientation is NOT applied: the processor's default (torchvision) path decodes url/base64 images with
//    decode_image(), which leaves it alone, and images passed as PIL objects are not transposed either.
// The header's dimensions are checked against the limits before any pixel buffer is allocated; corrupt,
// truncated or unsupported input is a Status (invalid_argument), never a crash.
#pragma once

#include <cstdint>
#include <span>

#include "kiln/status.h"
#include "rgb_image.h"

namespace kiln::vision {

struct DecodeLimits {
  uint64_t max_bytes = 32ull << 20;  // encoded size
  uint64_t max_pixels = 40'000'000;  // height * width
  uint64_t max_side = 32'768;        // either dimension
};

enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp };

// The container, from the leading magic bytes.
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);
const char* image_format_name(ImageFormat format);

// The caller names the image ("image 2: ...") with Status::with_context.
Result<RgbImage> decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits = {});

}  // namespace kiln::vision
