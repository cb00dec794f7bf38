#include "runtime/cuda/cuda_device_context.h"

#include <string>

namespace kiln::cuda {
namespace {
Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

Result<std::unique_ptr<CudaDeviceContext>> CudaDeviceContext::create() {
  std::unique_ptr<CudaDeviceContext> c(new CudaDeviceContext());
  KILN_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&c->device_), "cudaGetDevice"));
  KILN_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&c->sm_count_, cudaDevAttrMultiProcessorCount, c->device_),
                                   "SM count"));
  KILN_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  if (cublasCreate(&c->blas_) != CUBLAS_STATUS_SUCCESS) return internal_error("cublasCreate failed");
  if (cublasSetStream(c->blas_, c->stream_) != CUBLAS_STATUS_SUCCESS) return internal_error("cublasSetStream failed");
  KILN_ASSIGN_OR_RETURN(c->gemm_, CublasGemm::create());
  return c;
}

CudaDeviceContext::~CudaDeviceContext() {
  gemm_.reset();
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaDeviceContext::copy(void* dst, const void* src, size_t bytes, bool wait) {
  if (bytes == 0) return ok_status();
  KILN_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "device copy"));
  return wait ? synchronize() : ok_status();
}

Status CudaDeviceContext::synchronize() { return cuda_status(cudaStreamSynchronize(stream_), "stream synchronize"); }

}  // namespace kiln::cuda
