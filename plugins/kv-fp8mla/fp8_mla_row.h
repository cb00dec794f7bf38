// One token's row of the `fp8_ds_mla` cache (specs/serving-techniques.md §3), for any latent / rope width:
//   [0, L)              the latent c as L e4m3 values, c_i / scale_tile(i) rounded to nearest even;
//   [L, L + 4·T)        T = ⌈L / 128⌉ fp32 scales, one per 128-value tile: max(amax_tile / 448, FLT_MIN);
//   [L + 4·T, + 2·R)    the roped key part k_pe as R bf16 values (not quantized);
//   zero padding to a multiple of 16 bytes (none for DeepSeek / GLM shapes: 512 + 64 → 656 bytes, the NoPE
//   512 + 0 of GLM-5.3-Flash's DSA layers → 528).
// A stored value reads back as e4m3 · scale (fp32), the rope part as its bf16 value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::fp8mla {

inline constexpr int64_t kTile = 128;

struct RowGeometry {
  int64_t latent = 0;
  int64_t rope = 0;
  int64_t tiles() const { return (latent + kTile - 1) / kTile; }
  int64_t scales_offset() const { return latent; }
  int64_t rope_offset() const { return latent + 4 * tiles(); }
  int64_t bytes() const { return (rope_offset() + 2 * rope + 15) / 16 * 16; }
};

// Quantizes a row of latent + rope fp32 values (latent first) into `out` (g.bytes() bytes).
void encode_row(const RowGeometry& g, const float* values, uint8_t* out);
// The row's values as fp32: latent dequantized, rope widened; `out` holds g.latent + g.rope floats.
void decode_row(const RowGeometry& g, const uint8_t* row, float* out);

// bf16 rounding (to nearest even) and widening, for the rope part.
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t v);

}  // namespace kiln::fp8mla
