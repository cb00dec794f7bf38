// Warp-level tensor-core building blocks for the hand-written GEMM kernels: the SDK's (kiln/cuda/warp_mma.cuh) and
// the core's own additions.
// Fragment layout of m16n8k16: thread (g = lane/4, c = lane%4) holds rows g and g+8, columns 2c and 2c+1 of the
// 16×8 accumulator tile.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch_check.cuh"
#include "kiln/cuda/warp_mma.cuh"  // mma, ldmatrix, cp.async, pack_bf16x2

namespace kiln::cuda {

// The same with the A fragment as four registers (kernels that load it straight from global memory).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  mma_bf16_16816(d, a, b0, b1);
}

// 16 bytes of weights that are read once per step: through the non-coherent path, not kept in L1.
__device__ __forceinline__ uint4 load_stream(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace kiln::cuda
