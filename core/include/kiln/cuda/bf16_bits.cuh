// bf16 <-> fp32 on raw 16-bit patterns, for the core's kernels and plugins' alike (the SDK's device headers use
// them): a plugin kernel that rounds where a core kernel rounds gets the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even, NaN kept NaN (as kiln::cpu::float_to_bf16).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

}  // namespace kiln::cuda
