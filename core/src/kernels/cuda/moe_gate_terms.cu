#include "kernels/cuda/moe_gate_terms.h"

#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda {
namespace {

// logits[t][e] = parts[t][0][e] + (parts[t][1][e] + parts[t][2][e]): the small terms first, as they are the ones
// an fp32 sum can carry exactly.
__global__ void sum_terms_kernel(const float* __restrict__ parts, int64_t n, int64_t experts, int n_terms,
                                 float* __restrict__ logits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * experts) return;
  const float* row = parts + (i / experts) * n_terms * experts + i % experts;
  const float small = n_terms == 3 ? row[experts] + row[2 * experts] : row[experts];
  logits[i] = row[0] + small;
}

}  // namespace

Status moe_gate_logits_bf16_terms(cublasHandle_t blas, const uint16_t* x, int64_t n, int64_t hidden,
                                  const uint16_t* terms, int n_terms, int64_t experts, float* scratch, float* logits,
                                  StreamHandle stream) {
  if (n_terms < 1 || n_terms > 3) return invalid_argument("cuda::moe_gate_logits_bf16_terms: 1 to 3 terms");
  if (hidden <= 0 || experts <= 0 || n < 0) return invalid_argument("cuda::moe_gate_logits_bf16_terms: bad shape");
  if (!blas || (n > 0 && (!x || !terms || !logits)))
    return invalid_argument("cuda::moe_gate_logits_bf16_terms: blas, x, terms and logits must be set");
  if (n_terms > 1 && !scratch) return invalid_argument("cuda::moe_gate_logits_bf16_terms: scratch needed");
  const int64_t cols = n_terms * experts;
  if (n > INT32_MAX || hidden > INT32_MAX || cols > INT32_MAX)
    return invalid_argument("cuda::moe_gate_logits_bf16_terms: shape past cuBLAS's int range");
  if (n == 0) return ok_status();
  if (cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS)
    return internal_error("cuda::moe_gate_logits_bf16_terms: cublasSetStream failed");
  const float one = 1.f, zero = 0.f;
  float* const out = n_terms == 1 ? logits : scratch;
  // Column-major: out [cols, n] = termsᵀ-as-[hidden, cols]ᵀ · x-as-[hidden, n]; fp32 accumulation.
  const cublasStatus_t s = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(n),
                                        static_cast<int>(hidden), &one, terms, CUDA_R_16BF, static_cast<int>(hidden),
                                        x, CUDA_R_16BF, static_cast<int>(hidden), &zero, out, CUDA_R_32F,
                                        static_cast<int>(cols), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS)
    return internal_error(std::string("cuda::moe_gate_logits_bf16_terms: cublasGemmEx failed (") +
                          cublasGetStatusString(s) + ")");
  if (n_terms == 1) return ok_status();
  const int64_t total = n * experts;
  sum_terms_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(scratch, n, experts, n_terms, logits);
  return check_launch("cuda::moe_gate_logits_bf16_terms");
}

}  // namespace kiln::cuda
