// Dense bf16 projections: cuBLAS (tensor cores, fp32 accumulation), or for few rows (decode) the weight-streaming
// skinny GEMM of skinny_gemm.h.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// One cuBLAS handle; use it from one host thread at a time.
class CublasGemm {
 public:
  static Result<std::unique_ptr<CublasGemm>> create();
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // y[n, out] = x[n, in] · Wᵀ (+ y when accumulate); x, W bf16 row-major (W as nn.Linear's [out, in]);
  // y is bf16 or fp32 (y_dtype kBF16 / kF32). Few rows (skinny_gemm_preferred, with in % 8 == 0 and 16-byte
  // aligned x, W) run skinny_gemm_bf16, which reads W once; the rest runs cuBLAS.
  Status linear(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, void* y, DType y_dtype,
                StreamHandle stream, bool accumulate = false);

 private:
  CublasGemm(void* handle, int sm_count) : handle_(handle), sm_count_(sm_count) {}
  void* handle_;  // cublasHandle_t
  int sm_count_;  // of the device current at create()
};

}  // namespace kiln::cuda
