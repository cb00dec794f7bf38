#include "probe_pattern.h"

#include <cmath>
#include <cstring>

namespace kiln::nccl {
namespace {

float pattern(int rank, int64_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (static_cast<uint32_t>(rank) + 1u) * 40503u ^ seed * 97u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  if ((h & 63u) == 0) return (h & 64u) ? -0.0f : 0.0f;
  const float mantissa = static_cast<float>((h >> 8) & 0xFFFFu) / 65536.0f + 0.5f;  // [0.5, 1.5)
  const int exponent = static_cast<int>((h >> 24) % 17u) - 8;
  return ((h & 128u) ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
}

float input_value(DType dtype, int rank, int64_t i, uint32_t seed) {
  const float v = pattern(rank, i, seed);
  return dtype == DType::kBF16 ? bf16_value(bf16_bits(v)) : v;
}

void store(DType dtype, float v, char* at) {
  if (dtype == DType::kBF16) {
    const uint16_t b = bf16_bits(v);
    std::memcpy(at, &b, 2);
  } else {
    std::memcpy(at, &v, 4);
  }
}

}  // namespace

uint16_t bf16_bits(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<char> probe_input(DType dtype, int rank, int64_t count, uint32_t seed) {
  const size_t width = dtype_size(dtype);
  std::vector<char> out(static_cast<size_t>(count) * width);
  for (int64_t i = 0; i < count; ++i) store(dtype, input_value(dtype, rank, i, seed), out.data() + i * width);
  return out;
}

std::vector<char> probe_expected_sum(DType dtype, int world_size, int64_t count, uint32_t seed) {
  const size_t width = dtype_size(dtype);
  std::vector<char> out(static_cast<size_t>(count) * width);
  for (int64_t i = 0; i < count; ++i) {
    float acc = input_value(dtype, 0, i, seed);
    for (int r = 1; r < world_size; ++r) acc += input_value(dtype, r, i, seed);
    store(dtype, acc, out.data() + i * width);
  }
  return out;
}

}  // namespace kiln::nccl
