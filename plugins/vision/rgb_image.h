// An 8-bit RGB image as the glm5_next image processor consumes it: rows top to bottom, pixels left to right,
// R G B interleaved (what PIL's convert("RGB") and torchvision's decode_image(mode=RGB) hand the processor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::vision {

struct RgbImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> pixels;  // height * width * 3

  uint8_t at(int64_t y, int64_t x, int c) const { return pixels[static_cast<size_t>((y * width + x) * 3 + c)]; }
};

}  // namespace kiln::vision
