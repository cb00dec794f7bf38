// fp32 → bf16 as the layout's host codec rounds (fp8_mla_row.cpp): nearest even, a NaN kept a quiet NaN of the same
// sign and top payload bits. Shared by the append kernels so a row's rope part has the same bytes whichever wrote it.
#pragma once

#include <cstdint>

namespace kiln::fp8mla {

__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN, as the host
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace kiln::fp8mla
