#include "fp8_mla_row.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "fp8_e4m3.h"

namespace kiln::fp8mla {

uint16_t float_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN, sign kept
  bits += 0x7FFF + ((bits >> 16) & 1);                                   // to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

void encode_row(const RowGeometry& g, const float* values, uint8_t* out) {
  std::memset(out, 0, static_cast<size_t>(g.bytes()));
  for (int64_t t = 0; t < g.tiles(); ++t) {
    const int64_t begin = t * kTile, end = std::min(g.latent, begin + kTile);
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(values[i]));
    const float scale = std::max(amax / kE4m3Max, FLT_MIN);
    for (int64_t i = begin; i < end; ++i) out[i] = float_to_e4m3(values[i] / scale);
    std::memcpy(out + g.scales_offset() + 4 * t, &scale, 4);
  }
  for (int64_t i = 0; i < g.rope; ++i) {
    const uint16_t b = float_to_bf16(values[g.latent + i]);
    std::memcpy(out + g.rope_offset() + 2 * i, &b, 2);
  }
}

void decode_row(const RowGeometry& g, const uint8_t* row, float* out) {
  for (int64_t t = 0; t < g.tiles(); ++t) {
    float scale;
    std::memcpy(&scale, row + g.scales_offset() + 4 * t, 4);
    const int64_t begin = t * kTile, end = std::min(g.latent, begin + kTile);
    for (int64_t i = begin; i < end; ++i) out[i] = e4m3_to_float(row[i]) * scale;
  }
  for (int64_t i = 0; i < g.rope; ++i) {
    uint16_t b;
    std::memcpy(&b, row + g.rope_offset() + 2 * i, 2);
    out[g.latent + i] = bf16_to_float(b);
  }
}

}  // namespace kiln::fp8mla
