// Shared-memory mbarriers (sm_90) for producer / consumer pipelines inside a CTA.
//
// A barrier completes a phase once `count` arrivals have been made; phases alternate parity 0, 1, 0, ... starting
// at 0. Waiting on parity p returns once the phase of that parity has completed — so right after init, waiting on
// parity 1 returns at once (the "previous" phase counts as complete), which lets a producer pass its first round of
// empty-slot waits. Arrivals release, completed waits acquire, at CTA scope.
#pragma once

#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ void mbarrier_init(uint32_t addr, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}

// After initializing barriers that the copy engine will complete (TMA complete_tx): makes the inits visible to it.
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbarrier_arrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
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

}  // namespace kiln::cuda
