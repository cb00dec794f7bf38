// Programmatic dependent launch (Hopper and later): a kernel launched with launch_pdl may be scheduled while the
// kernel before it on the stream is still finishing, so its launch latency and its independent prologue (streaming
// weights toward L2, which no earlier kernel writes) overlap the previous kernel's tail. A decode step is ~900
// small kernels; the gap between two of them is a large share of each.
//
// The contract every kernel launched with launch_pdl keeps:
//   1. before pdl_wait(), touch nothing an earlier kernel of the stream writes or reads-then-overwrites:
//      only weights (read-only for the whole run) and the kernel's own registers / shared memory;
//   2. call pdl_wait() (griddepcontrol.wait: returns once every earlier grid it depends on has completed and its
//      writes are visible) before any other global memory access, on every path, including early exits that
//      write nothing (an exiting CTA is fine: it touches nothing);
//   3. call pdl_launch_dependents() after its own pdl_wait(), so at most two kernels overlap: this one running
//      and the next one in its prologue.
// Because each kernel waits for the one before it to complete, and that one waited for its predecessor, the
// order of the stream holds transitively. Kernels launched plainly (cuBLAS, older kernels) keep full
// serialisation both ways; a launch_pdl kernel after one of them simply starts when it ends.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kiln/cuda/pdl_launch.cuh"  // launch_with_pdl
#include "kiln/cuda/warp_mma.cuh"   // pdl_wait, pdl_launch_dependents

namespace kiln::cuda {

// Pulls [p, p + bytes) toward L2 without waiting for it (no register is written): the prologue of a weight-
// streaming kernel issues this for the weights its CTA will read, before pdl_wait().
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes, int thread, int threads) {
  const char* base = static_cast<const char*>(p);
  for (size_t off = static_cast<size_t>(thread) * 128; off < bytes; off += static_cast<size_t>(threads) * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
}

// Whether launch_pdl sets the programmatic-serialisation attribute: on sm_90+ devices unless KILN_PDL=0
// (an A/B switch for measuring it). Decided once per process, on the current device.
bool pdl_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the previous kernel on the stream when
// pdl_enabled(). The kernel must keep the contract above; its launch error comes back as from cudaGetLastError.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  return launch_with_pdl(kernel, grid, block, smem, stream, pdl_enabled(), std::forward<Args>(args)...);
}

}  // namespace kiln::cuda
