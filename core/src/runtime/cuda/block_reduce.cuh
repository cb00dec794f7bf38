// A block-wide reduction shared by the runtime's glue kernels.
#pragma once

#include <cfloat>

#include "kiln/cuda/mla_append_row.cuh"  // block_sum_f64

namespace kiln::cuda {

// Block-wide reduction of one value per thread; every thread gets the result. `shared` holds ≥ 32 floats.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : (kMax ? -FLT_MAX : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  return v;
}

}  // namespace kiln::cuda
