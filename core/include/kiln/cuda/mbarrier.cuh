// Shared-memory mbarriers, named CTA barriers and bulk copies (sm_90) for producer / consumer pipelines inside a
// CTA: the SDK's, so a plugin's kernels stream their tiles the way the core's Hopper kernels do. nvcc only.
//
// A barrier completes a phase once `count` arrivals have been made (and, with expect_tx, the bytes it was told to
// expect have landed); phases alternate parity 0, 1, 0, ... starting at 0. Waiting on parity p returns once the
// phase of that parity has completed — so right after init, waiting on parity 1 returns at once (the "previous"
// phase counts as complete), which lets a producer pass its first round of empty-slot waits. Arrivals release,
// completed waits acquire, at CTA scope.
#pragma once

#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ void mbarrier_init(uint32_t addr, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}

// After initializing barriers that the copy engine will complete (bulk copies' complete_tx): makes the inits
// visible to it.
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbarrier_arrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
}

// Arrives once on the barrier and adds `bytes` to the transaction count its current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint32_t addr, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "MBARRIER_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra MBARRIER_WAIT;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

// Shared memory written through the generic proxy (st.shared, cp.async) before the async proxy (a bulk copy into
// it, or the tensor cores reading it) touches it: each writing thread fences, then the barrier.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// One contiguous global → shared copy by the copy engine (no tensor map): `bytes` a multiple of 16, both addresses
// 16-byte aligned; completion counts the bytes on `bar` (arm it with mbarrier_arrive_expect_tx first).
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Barrier among `threads` threads (whole warps) on hardware barrier `id` (0 is __syncthreads'; 16 in all): waits
// until `threads` threads have arrived or synced on it. Shared-memory writes before it are visible after it to the
// threads that synced.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on hardware barrier `id` without waiting (the producer half of a producer / consumer hand-off whose
// consumers named_barrier_sync with the same count): this warp's earlier shared-memory writes become visible to them.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace kiln::cuda
