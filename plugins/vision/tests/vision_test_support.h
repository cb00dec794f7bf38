// What the vision tests share: fixture files (tests/data, made by tools/make_vision_fixtures.py), the checksum the
// fixtures store for pixel buffers, and the synthetic image formula the resize fixtures are defined by.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rgb_image.h"

namespace kiln::vision::testing {

inline std::filesystem::path data_dir() {
  return KILN_VISION_TEST_DATA;
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline nlohmann::json read_json(const std::string& name) {
  std::ifstream in(data_dir() / name);
  return nlohmann::json::parse(in);
}

// Σ b[i]·(1 + (i·2654435761 mod 2^32)) mod 2^64, as 16 hex digits (the fixtures' checksum of HWC bytes).
inline std::string checksum(const std::vector<uint8_t>& bytes) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < bytes.size(); ++i) sum += uint64_t{bytes[i]} * (1 + ((i * 2654435761ull) & 0xffffffffull));
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(sum));
  return text;
}

// tools/make_vision_fixtures.py synthetic(): hashed noise on the left half, a horizontal ramp on the right.
inline RgbImage synthetic(int64_t height, int64_t width, uint32_t seed) {
  RgbImage image;
  image.height = height;
  image.width = width;
  image.pixels.resize(static_cast<size_t>(height * width * 3));
  const uint32_t seed_mix = static_cast<uint32_t>((uint64_t{seed} * 2654435761ull) & 0xffffffffull);
  const uint32_t ramp_den = static_cast<uint32_t>(width > 1 ? width - 1 : 1);
  for (uint32_t y = 0; y < height; ++y)
    for (uint32_t x = 0; x < width; ++x)
      for (uint32_t c = 0; c < 3; ++c) {
        uint32_t v = (y * 73856093u) ^ (x * 19349663u) ^ (c * 83492791u) ^ seed_mix;
        v *= 0x9E3779B1u;
        v ^= v >> 15;
        const uint8_t value = x < static_cast<uint32_t>(width / 2) ? static_cast<uint8_t>(v & 255u)
                                                                   : static_cast<uint8_t>(x * 255u / ramp_den);
        image.pixels[(static_cast<size_t>(y) * width + x) * 3 + c] = value;
      }
  return image;
}

}  // namespace kiln::vision::testing
