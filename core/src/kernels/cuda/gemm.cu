#include <cublas_v2.h>

#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/skinny_gemm.h"

namespace kiln::cuda {
namespace {

Status check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error(std::string(what) + ": " + cublasGetStatusString(s));
}

}  // namespace

Result<std::unique_ptr<CublasGemm>> CublasGemm::create() {
  int device = 0, sm_count = 0;
  KILN_RETURN_IF_ERROR(check_cuda(cudaGetDevice(&device), "cuda::CublasGemm: cudaGetDevice"));
  KILN_RETURN_IF_ERROR(check_cuda(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device),
                                  "cuda::CublasGemm: SM count"));
  cublasHandle_t handle = nullptr;
  KILN_RETURN_IF_ERROR(check_cublas(cublasCreate(&handle), "cuda::CublasGemm: cublasCreate"));
  return std::unique_ptr<CublasGemm>(new CublasGemm(handle, sm_count));
}

CublasGemm::~CublasGemm() { cublasDestroy(static_cast<cublasHandle_t>(handle_)); }

Status CublasGemm::linear(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, void* y,
                          DType y_dtype, StreamHandle stream, bool accumulate) {
  if (y_dtype != DType::kBF16 && y_dtype != DType::kF32)
    return invalid_argument("cuda::CublasGemm::linear: y must be bf16 or fp32");
  if (n < 0 || in <= 0 || out <= 0 || n > INT32_MAX || in > INT32_MAX || out > INT32_MAX)
    return invalid_argument("cuda::CublasGemm::linear: dimensions out of range");
  if (n == 0) return ok_status();
  if (skinny_gemm_preferred(n, out) && skinny_gemm_supported(x, n, in, w))
    return skinny_gemm_bf16(x, n, in, w, out, y, y_dtype, accumulate, sm_count_, stream);
  auto h = static_cast<cublasHandle_t>(handle_);
  KILN_RETURN_IF_ERROR(check_cublas(cublasSetStream(h, stream), "cuda::CublasGemm: cublasSetStream"));
  // Column-major view: Y^T[out, n] = W[out, in] · X^T[in, n], with W stored as W^T col-major (lda = in).
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  const cudaDataType_t y_type = y_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  return check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(n),
                                   static_cast<int>(in), &alpha, w, CUDA_R_16BF, static_cast<int>(in), x, CUDA_R_16BF,
                                   static_cast<int>(in), &beta, y, y_type, static_cast<int>(out), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
                      "cuda::CublasGemm::linear: cublasGemmEx");
}

}  // namespace kiln::cuda
