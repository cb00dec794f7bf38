// The glm5_next image processor end to end against transformers 5.17 (images.json): decoded file → canvas
// (checksum of the resized, zero-padded uint8 canvas), image_grid_thw, pixel_values shape, sampled values bit for
// bit and the whole sum — tiny (minimum-token upscale), in-budget (padding only), panoramic and huge (the
// maximum-token binary search) images in PNG, JPEG and WebP.
#include "image_processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "image_decode.h"
#include "patchify.h"
#include "vision_test_support.h"

namespace kiln::vision {
namespace {

using testing::checksum;
using testing::data_dir;
using testing::read_bytes;

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

float from_bits(const std::string& hex) {
  const uint32_t b = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

TEST(ImageProcessor, NormalisationConstantsAreTransformers) {
  const auto manifest = testing::read_json("images.json");
  float mean255[3], std255[3];
  fused_normalization(ImageProcessorConfig{}, mean255, std255);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(bits(mean255[c]), bits(from_bits(manifest["mean255_bits"][c]))) << c;
    EXPECT_EQ(bits(std255[c]), bits(from_bits(manifest["std255_bits"][c]))) << c;
  }
}

TEST(ImageProcessor, MatchesTransformersOnEveryFixture) {
  const auto manifest = testing::read_json("images.json");
  const ImageProcessorConfig config;
  ASSERT_GE(manifest["images"].size(), 15u);
  for (const auto& entry : manifest["images"]) {
    const std::string file = entry["file"];
    auto image = decode_image(read_bytes(data_dir() / file));
    ASSERT_TRUE(image.ok()) << file << ": " << image.status().to_string();
    auto plan = plan_canvas(image->height, image->width, config);
    ASSERT_TRUE(plan.ok()) << file;
    const RgbImage canvas = build_canvas(*image, *plan);
    EXPECT_EQ(canvas.height, entry["canvas"]["height"].get<int64_t>()) << file;
    EXPECT_EQ(canvas.width, entry["canvas"]["width"].get<int64_t>()) << file;
    EXPECT_EQ(checksum(canvas.pixels), entry["canvas"]["checksum"].get<std::string>()) << file;

    auto processed = process_image(*image, config);
    ASSERT_TRUE(processed.ok()) << file;
    const auto grid = entry["image_grid_thw"];
    EXPECT_EQ(processed->grid_thw[0], grid[0].get<int64_t>()) << file;
    EXPECT_EQ(processed->grid_thw[1], grid[1].get<int64_t>()) << file;
    EXPECT_EQ(processed->grid_thw[2], grid[2].get<int64_t>()) << file;
    const auto shape = entry["pixel_values"]["shape"];
    ASSERT_EQ(processed->pixel_values.size(), shape[0].get<size_t>() * shape[1].get<size_t>()) << file;
    EXPECT_EQ(processed->num_patches(), shape[0].get<int64_t>()) << file;
    EXPECT_EQ(shape[1].get<int64_t>(), 1176) << file;

    double max_difference = 0.0;
    for (const auto& sample : entry["pixel_values"]["samples"]) {
      const size_t index = sample[0];
      const float expected = from_bits(sample[1]);
      const float actual = processed->pixel_values[index];
      max_difference = std::max(max_difference, static_cast<double>(std::abs(actual - expected)));
      EXPECT_EQ(bits(actual), bits(expected)) << file << " pixel_values[" << index << "]";
    }
    double sum = 0.0;
    for (float v : processed->pixel_values) sum += v;
    const double expected_sum = entry["pixel_values"]["sum"];
    EXPECT_NEAR(sum, expected_sum, 1e-6 * std::max(1.0, std::abs(expected_sum)) + 1e-3) << file;
    RecordProperty(file, std::to_string(max_difference));
    std::printf("  %-28s %5lldx%-5lld -> canvas %5lldx%-5lld grid [1, %lld, %lld], sampled max |diff| %g\n",
                file.c_str(), static_cast<long long>(image->height), static_cast<long long>(image->width),
                static_cast<long long>(canvas.height), static_cast<long long>(canvas.width),
                static_cast<long long>(processed->grid_thw[1]), static_cast<long long>(processed->grid_thw[2]),
                max_difference);
  }
}

TEST(ImageProcessor, PatchOrderIsMergeBlocks) {
  // A canvas whose every 14×14 patch is one gray level (its index in row-major patch order): the processor's
  // patch k must come from row-block, column-block, inner row, inner column.
  ImageProcessorConfig config;
  RgbImage canvas;
  canvas.height = 56;
  canvas.width = 84;  // grid 4×6 patches, 2×3 merge blocks
  canvas.pixels.resize(56 * 84 * 3);
  for (int64_t y = 0; y < 56; ++y)
    for (int64_t x = 0; x < 84; ++x)
      for (int c = 0; c < 3; ++c) canvas.pixels[(y * 84 + x) * 3 + c] = static_cast<uint8_t>((y / 14) * 6 + x / 14);
  const auto values = patchify(canvas, config);
  ASSERT_EQ(values.size(), 24u * 1176);
  float mean255[3], std255[3];
  fused_normalization(config, mean255, std255);
  int k = 0;
  for (int rb = 0; rb < 2; ++rb)
    for (int cb = 0; cb < 3; ++cb)
      for (int ir = 0; ir < 2; ++ir)
        for (int ic = 0; ic < 2; ++ic, ++k) {
          const int level = (rb * 2 + ir) * 6 + (cb * 2 + ic);
          for (int c = 0; c < 3; ++c) {
            const float expected = (static_cast<float>(level) - mean255[c]) / std255[c];
            // (C, T, 14, 14): channel c occupies 2·196 consecutive values, both frames identical.
            EXPECT_EQ(values[k * 1176 + c * 392], expected) << "patch " << k << " channel " << c;
            EXPECT_EQ(values[k * 1176 + c * 392 + 391], expected) << "patch " << k << " channel " << c;
          }
        }
}

}  // namespace
}  // namespace kiln::vision
