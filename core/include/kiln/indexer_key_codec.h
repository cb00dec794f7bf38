// Host codec of the DSA indexer's fp8 key rows (IndexerKeyFormat::kFp8E4m3Scaled, kiln/indexer_key_format.h):
// the CPU reference the core's indexer writes and reads, and what the CUDA append must match byte for byte.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kiln/fp8_e4m3.h"
#include "kiln/indexer_key_format.h"

namespace kiln {

// The row's scale: max(amax / 448, FLT_MIN), so an all-zero (or all-subnormal) key still divides by a normal.
inline float indexer_key_fp8_scale_for(const float* k, int64_t dim) {
  float amax = 0.0f;
  for (int64_t i = 0; i < dim; ++i) amax = std::max(amax, std::fabs(k[i]));
  return std::max(amax / kE4m3Max, FLT_MIN);
}

// k [dim] fp32 → row [dim + 4]: e4m3(k_i / scale) then the fp32 scale.
inline void encode_indexer_key_fp8(const float* k, int64_t dim, uint8_t* row) {
  const float scale = indexer_key_fp8_scale_for(k, dim);
  for (int64_t i = 0; i < dim; ++i) row[i] = float_to_e4m3(k[i] / scale);
  std::memcpy(row + dim, &scale, sizeof(float));
}

inline float indexer_key_fp8_scale(const uint8_t* row, int64_t dim) {
  float scale;
  std::memcpy(&scale, row + dim, sizeof(float));
  return scale;
}

// The key as the scores see it: e4m3 · scale (fp32), into out [dim].
inline void decode_indexer_key_fp8(const uint8_t* row, int64_t dim, float* out) {
  const float scale = indexer_key_fp8_scale(row, dim);
  for (int64_t i = 0; i < dim; ++i) out[i] = e4m3_to_float(row[i]) * scale;
}

}  // namespace kiln
