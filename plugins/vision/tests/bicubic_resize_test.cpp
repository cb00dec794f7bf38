// The antialiased bicubic uint8 resize against torchvision's (tools/make_vision_fixtures.py resize.json): every
// size pair, up and down, one axis only, extreme ratios, byte for byte.
#include "bicubic_resize.h"

#include <gtest/gtest.h>

#include "vision_test_support.h"

namespace kiln::vision {
namespace {

using testing::checksum;
using testing::read_json;
using testing::synthetic;

TEST(BicubicResize, MatchesTorchvisionByteForByte) {
  const auto fixture = read_json("resize.json");
  int checked = 0;
  for (const auto& c : fixture["cases"]) {
    const int64_t ih = c["in"][0], iw = c["in"][1], oh = c["out"][0], ow = c["out"][1];
    const RgbImage input = synthetic(ih, iw, c["seed"].get<uint32_t>());
    ASSERT_EQ(checksum(input.pixels), c["input_checksum"].get<std::string>()) << "synthetic input " << ih << "x" << iw;
    const RgbImage output = resize_bicubic_antialias(input, oh, ow);
    ASSERT_EQ(output.height, oh);
    ASSERT_EQ(output.width, ow);
    EXPECT_EQ(checksum(output.pixels), c["checksum"].get<std::string>())
        << ih << "x" << iw << " -> " << oh << "x" << ow << " (seed " << c["seed"] << ")";
    ++checked;
  }
  EXPECT_GE(checked, 150);
}

TEST(BicubicResize, SameSizeIsACopy) {
  const RgbImage input = synthetic(7, 9, 3);
  EXPECT_EQ(resize_bicubic_antialias(input, 7, 9).pixels, input.pixels);
}

TEST(BicubicResize, ConstantStaysConstant) {
  RgbImage input;
  input.height = 50;
  input.width = 70;
  input.pixels.assign(50 * 70 * 3, 77);
  for (auto [h, w] : {std::pair{13, 200}, std::pair{200, 13}, std::pair{1, 1}}) {
    const RgbImage output = resize_bicubic_antialias(input, h, w);
    for (uint8_t v : output.pixels) ASSERT_EQ(v, 77) << h << "x" << w;
  }
}

}  // namespace
}  // namespace kiln::vision
