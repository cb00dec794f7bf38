// Decoding: every fixture image to the RGB8 pixels transformers' decode gives (checksums in images.json), the
// errors a request sees (unknown container, limits, corrupt data), and hostile input: every truncation of the
// fixture files and thousands of bit flips decode or fail cleanly — run under ASan/UBSan by .ci/run.
#include "image_decode.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "vision_test_support.h"

namespace kiln::vision {
namespace {

using testing::checksum;
using testing::data_dir;
using testing::read_bytes;

std::vector<uint8_t> fixture(const std::string& name) {
  return read_bytes(data_dir() / "images" / name);
}

TEST(ImageDecode, FixturesDecodeAsTransformersDoes) {
  const auto manifest = testing::read_json("images.json");
  for (const auto& entry : manifest["images"]) {
    const std::string file = entry["file"];
    const auto bytes = read_bytes(data_dir() / file);
    ASSERT_FALSE(bytes.empty()) << file;
    auto image = decode_image(bytes);
    ASSERT_TRUE(image.ok()) << file << ": " << image.status().to_string();
    EXPECT_EQ(image->height, entry["decoded"]["height"].get<int64_t>()) << file;
    EXPECT_EQ(image->width, entry["decoded"]["width"].get<int64_t>()) << file;
    EXPECT_EQ(checksum(image->pixels), entry["decoded"]["checksum"].get<std::string>()) << file;
  }
}

// transformers' default path (torchvision decode_image) ignores EXIF orientation; so does kiln.
TEST(ImageDecode, ExifOrientationIsNotApplied) {
  auto image = decode_image(fixture("exif_rotated.jpg"));
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  EXPECT_EQ(image->height, 60);
  EXPECT_EQ(image->width, 90);
}

TEST(ImageDecode, SniffsTheContainer) {
  EXPECT_EQ(sniff_image_format(fixture("tiny_rgb.png")), ImageFormat::kPng);
  EXPECT_EQ(sniff_image_format(fixture("photo.jpg")), ImageFormat::kJpeg);
  EXPECT_EQ(sniff_image_format(fixture("panorama.webp")), ImageFormat::kWebp);
  const std::string gif = "GIF89a....";
  EXPECT_EQ(sniff_image_format({reinterpret_cast<const uint8_t*>(gif.data()), gif.size()}), ImageFormat::kUnknown);
}

TEST(ImageDecode, UnknownContainerIsNamed) {
  const std::string text = "<svg xmlns='http://www.w3.org/2000/svg'/>";
  auto image = decode_image({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(image.status().with_context("image 2").message(), "image 2: not a PNG, JPEG or WebP");
  EXPECT_FALSE(decode_image({}).ok());
}

TEST(ImageDecode, LimitsAreCheckedBeforeDecoding) {
  DecodeLimits limits;
  limits.max_pixels = 16 * 16;
  for (const char* name : {"photo.jpg", "small_rgba.png", "panorama.webp"}) {
    auto image = decode_image(fixture(name), limits);
    ASSERT_FALSE(image.ok()) << name;
    EXPECT_NE(image.status().message().find("exceeds the limit of 256 pixels"), std::string::npos)
        << image.status().message();
  }
  auto big = decode_image(fixture("photo.jpg"), DecodeLimits{.max_bytes = 1000});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("exceeds the limit of 1000 bytes"), std::string::npos);
}

// A header claiming 20000×20000 is refused from the header alone (the data behind it is absent).
TEST(ImageDecode, HugeHeaderIsRefusedByName) {
  auto bytes = fixture("tiny_rgb.png");
  // IHDR width/height: bytes 16..23, big endian; the CRC no longer matches, but the size check comes first only
  // if libpng accepts the chunk, so rewrite the CRC too.
  const uint32_t side = 20000;
  for (int i = 0; i < 4; ++i) bytes[16 + i] = bytes[20 + i] = static_cast<uint8_t>(side >> (24 - 8 * i));
  uint32_t crc = 0xffffffffu;
  for (size_t i = 12; i < 29; ++i) {
    crc ^= bytes[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  crc ^= 0xffffffffu;
  for (int i = 0; i < 4; ++i) bytes[29 + i] = static_cast<uint8_t>(crc >> (24 - 8 * i));
  auto image = decode_image(bytes);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().with_context("image 0").message(),
            "image 0: PNG image of 20000×20000 pixels exceeds the limit of 40000000 pixels");
}

TEST(ImageDecode, EveryTruncationFailsCleanly) {
  for (const char* name : {"tiny_rgb.png", "gray2_interlaced.png", "palette_trns.png", "gray16.png", "cmyk.jpg",
                           "gray_progressive.jpg", "rgba_lossless.webp"}) {
    const auto bytes = fixture(name);
    for (size_t size = 0; size < bytes.size(); ++size) {
      auto image = decode_image({bytes.data(), size});
      // libwebp and libjpeg may finish a file whose missing tail held nothing needed; anything else is an error.
      if (image.ok()) {
        EXPECT_EQ(image->pixels.size(), static_cast<size_t>(image->height * image->width * 3)) << name;
      } else {
        EXPECT_EQ(image.status().code(), StatusCode::kInvalidArgument) << name << " at " << size;
      }
    }
  }
}

TEST(ImageDecode, TruncatedFilesAreErrors) {
  for (const char* name : {"tiny_rgb.png", "photo.jpg", "panorama.webp"}) {
    const auto bytes = fixture(name);
    auto image = decode_image({bytes.data(), bytes.size() * 2 / 3});
    ASSERT_FALSE(image.ok()) << name;
    EXPECT_NE(image.status().message().find("corrupt"), std::string::npos) << image.status().message();
  }
}

TEST(ImageDecode, BitFlipsNeverCrash) {
  std::mt19937 rng(18);
  for (const char* name : {"tiny_rgb.png", "palette_trns.png", "gray2_interlaced.png", "cmyk.jpg",
                           "gray_progressive.jpg", "rgba_lossless.webp", "small_rgba.png"}) {
    const auto original = fixture(name);
    for (int round = 0; round < 400; ++round) {
      auto bytes = original;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      auto image = decode_image(bytes);
      if (image.ok()) ASSERT_EQ(image->pixels.size(), static_cast<size_t>(image->height * image->width * 3)) << name;
    }
  }
}

}  // namespace
}  // namespace kiln::vision
