// Bulk tensor copies (TMA, sm_90): global → shared tiles described by a CUtensorMap, completion counted in bytes
// on an mbarrier (kiln/cuda/mbarrier.cuh). A 128-byte-swizzled map whose box is 64 bf16 wide lands each box as rows of 128
// bytes with 16-byte chunk c of row r at chunk c ^ (r % 8) — the layout wgmma.cuh's descriptors read — provided the
// destination is 1024-byte aligned. Elements outside the tensor's extent arrive as zeros.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kiln/cuda/mbarrier.cuh"
#include "kiln/status.h"

namespace kiln::cuda {

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// A bf16 tensor map of rank dims.size() (innermost first; strides in elements for dims 1..), 128-byte swizzle.
Status make_bf16_tensor_map_128b(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                                 const uint64_t* strides_elems, const uint32_t* box, const char* what);

}  // namespace kiln::cuda
