// The merge counters of the tensor-core MLA decode attention (MlaDecodeParams::sync in kiln/cuda/mla_decode_plan.h),
// owned by the KV layout that launches it: allocated and zeroed once on the layout's device; the kernel leaves them
// zero after every launch, so they need no reset between steps or inside CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include "kiln/cuda/mla_decode_plan.h"

namespace kiln::cuda {

class MlaDecodeSync {
 public:
  // Null get() when the allocation fails: the attention then merges its splits in a second launch (same bits).
  explicit MlaDecodeSync(int device) {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) return;
    void* p = nullptr;
    if (cudaMalloc(&p, mla_decode_sync_bytes()) == cudaSuccess) {
      // cudaMemset runs on the legacy default stream and may return before it lands; the model's stream is
      // non-blocking (does not wait for that stream), so wait here rather than let a first decode read stale counters.
      if (cudaMemset(p, 0, mla_decode_sync_bytes()) == cudaSuccess &&
          cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess)
        counters_ = static_cast<unsigned*>(p);
      else
        cudaFree(p);
    }
    cudaSetDevice(previous);
  }
  ~MlaDecodeSync() {
    if (counters_) cudaFree(counters_);
  }
  MlaDecodeSync(const MlaDecodeSync&) = delete;
  MlaDecodeSync& operator=(const MlaDecodeSync&) = delete;

  unsigned* get() const { return counters_; }

 private:
  unsigned* counters_ = nullptr;
};

}  // namespace kiln::cuda
