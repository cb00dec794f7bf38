#include "kernels/cuda/moe_gate_terms.h"

#include <cstdlib>
#include <string>

#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda {
namespace {

// parts [splits][n][n_terms][experts]. A term's logit is its splits' sum in split order; the logit is
// term 0 + (term 1 + term 2): the small terms first, as they are the ones an fp32 sum can carry exactly.
__global__ void sum_terms_kernel(const float* __restrict__ parts, int64_t n, int64_t experts, int n_terms, int splits,
                                 float* __restrict__ logits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * experts) return;
  const int64_t split_stride = n * n_terms * experts;
  const float* row = parts + (i / experts) * n_terms * experts + i % experts;
  float term[3] = {0.f, 0.f, 0.f};
  for (int t = 0; t < n_terms; ++t) {
    float v = row[t * experts];
    for (int s = 1; s < splits; ++s) v += row[s * split_stride + t * experts];
    term[t] = v;
  }
  const float small = n_terms == 3 ? term[1] + term[2] : term[1];
  logits[i] = n_terms == 1 ? term[0] : term[0] + small;
}

int env_splits() {
  const char* v = std::getenv("KILN_MOE_GATE_SPLITK");
  return v && *v ? std::atoi(v) : 0;
}

}  // namespace

int moe_gate_terms_splits(int64_t n, int64_t hidden, int n_terms, int64_t experts, int64_t scratch_floats, int sms) {
  const int64_t cols = n_terms * experts;
  // cuBLAS's tiles for this shape are about 128 × 128 (measured: 4096 × 192 ran as one wave of 64 CTAs).
  const int64_t tiles = ((n + 127) / 128) * ((cols + 127) / 128);
  const int forced = env_splits();
  for (const int s : {4, 2}) {
    if (forced > 0 && s != forced) continue;
    const bool fits = hidden % (8 * s) == 0 && s * cols * n <= scratch_floats;  // 16-byte aligned slices
    if (fits && (forced > 0 || tiles * s <= sms)) return s;
  }
  return 1;
}

Status moe_gate_logits_bf16_terms(cublasHandle_t blas, const uint16_t* x, int64_t n, int64_t hidden,
                                  const uint16_t* terms, int n_terms, int64_t experts, float* scratch,
                                  int64_t scratch_floats, float* logits, StreamHandle stream) {
  if (n_terms < 1 || n_terms > 3) return invalid_argument("cuda::moe_gate_logits_bf16_terms: 1 to 3 terms");
  if (hidden <= 0 || experts <= 0 || n < 0) return invalid_argument("cuda::moe_gate_logits_bf16_terms: bad shape");
  if (!blas || (n > 0 && (!x || !terms || !logits)))
    return invalid_argument("cuda::moe_gate_logits_bf16_terms: blas, x, terms and logits must be set");
  const int64_t cols = n_terms * experts;
  if (!scratch) scratch_floats = 0;
  if (n_terms > 1 && scratch_floats < n * cols)
    return invalid_argument("cuda::moe_gate_logits_bf16_terms: scratch of n · terms · experts floats needed");
  if (n > INT32_MAX || hidden > INT32_MAX || cols > INT32_MAX)
    return invalid_argument("cuda::moe_gate_logits_bf16_terms: shape past cuBLAS's int range");
  if (n == 0) return ok_status();
  if (cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS)
    return internal_error("cuda::moe_gate_logits_bf16_terms: cublasSetStream failed");
  int dev = 0, sms = 0;
  KILN_RETURN_IF_ERROR(check_cuda(cudaGetDevice(&dev), "cuda::moe_gate_logits_bf16_terms"));
  KILN_RETURN_IF_ERROR(check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                                  "cuda::moe_gate_logits_bf16_terms"));
  const int splits = moe_gate_terms_splits(n, hidden, n_terms, experts, scratch_floats, sms);
  const float one = 1.f, zero = 0.f;
  float* const out = n_terms == 1 && splits == 1 ? logits : scratch;
  const int64_t k = hidden / splits;
  // Column-major: out [cols, n] = termsᵀ-as-[hidden, cols]ᵀ · x-as-[hidden, n]; fp32 accumulation. Split s takes
  // the hidden columns s·k .. s·k + k − 1 of both and writes its own [n, cols] block.
  const cublasStatus_t s =
      splits == 1
          ? cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(n),
                         static_cast<int>(hidden), &one, terms, CUDA_R_16BF, static_cast<int>(hidden), x, CUDA_R_16BF,
                         static_cast<int>(hidden), &zero, out, CUDA_R_32F, static_cast<int>(cols), CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT)
          : cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(n),
                                       static_cast<int>(k), &one, terms, CUDA_R_16BF, static_cast<int>(hidden), k, x,
                                       CUDA_R_16BF, static_cast<int>(hidden), k, &zero, out, CUDA_R_32F,
                                       static_cast<int>(cols), n * cols, splits, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS)
    return internal_error(std::string("cuda::moe_gate_logits_bf16_terms: cuBLAS GEMM failed (") +
                          cublasGetStatusString(s) + ")");
  if (out == logits) return ok_status();
  const int64_t total = n * experts;
  sum_terms_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(scratch, n, experts, n_terms,
                                                                                     splits, logits);
  return check_launch("cuda::moe_gate_logits_bf16_terms");
}

}  // namespace kiln::cuda
