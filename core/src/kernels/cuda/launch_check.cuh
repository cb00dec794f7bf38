// Shared by the .cu files: turning CUDA errors into Status, and bf16 <-> fp32 on raw 16-bit patterns.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kiln/cuda/bf16_bits.cuh"
#include "kiln/status.h"

namespace kiln::cuda {

// The launch's own error (bad configuration) or an earlier asynchronous one, named after the kernel.
inline Status check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string(kernel) + ": " + cudaGetErrorString(e));
}

inline Status check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Eight bf16 values in one 16-byte word.
struct alignas(16) Bf16x8 {
  uint16_t v[8];
};

__device__ __forceinline__ void bf16x8_to_float(const uint4& raw, float out[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

inline unsigned blocks_for(int64_t items, int threads) { return static_cast<unsigned>((items + threads - 1) / threads); }

}  // namespace kiln::cuda
