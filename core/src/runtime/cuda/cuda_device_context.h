// The DeviceContext of one CUDA device: memory from a DeviceArena (counted, freed with the context), the compute
// stream the model's steps run on, and a cuBLAS handle bound to it for the built-in kernels.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>

#include "kernels/cuda/gemm.h"
#include "kiln/device_context.h"
#include "runtime/cuda/device_arena.h"

namespace kiln::cuda {

class CudaDeviceContext final : public DeviceContext {
 public:
  // On the current CUDA device, with a non-blocking stream of its own.
  static Result<std::unique_ptr<CudaDeviceContext>> create();
  ~CudaDeviceContext() override;
  CudaDeviceContext(const CudaDeviceContext&) = delete;
  CudaDeviceContext& operator=(const CudaDeviceContext&) = delete;

  Device device() const override { return Device::cuda(device_); }
  Stream stream() const override { return {device(), stream_}; }
  Result<void*> allocate(size_t bytes, const char* what) override { return arena_.allocate(bytes, what); }
  int multiprocessor_count() const override { return sm_count_; }
  Status copy(void* dst, const void* src, size_t bytes, bool wait) override;
  Status synchronize() override;

  cudaStream_t cuda_stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  CublasGemm& gemm() { return *gemm_; }
  DeviceArena& arena() { return arena_; }
  size_t bytes_allocated() const { return arena_.bytes_used(); }

 private:
  CudaDeviceContext() = default;
  int device_ = 0;
  int sm_count_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<CublasGemm> gemm_;
  DeviceArena arena_;
};

// The CUDA stream behind an SDK Stream (the compute stream of a CudaDeviceContext).
inline cudaStream_t cuda_stream_of(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }

}  // namespace kiln::cuda
