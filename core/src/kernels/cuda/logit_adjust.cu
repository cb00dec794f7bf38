#include <cmath>
#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/logit_adjust.h"

namespace kiln::cuda {
namespace {

constexpr int kAdjustThreads = 256;
constexpr int kMinPThreads = 512;

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__global__ void __launch_bounds__(kAdjustThreads)
    adjust_logits_kernel(float* __restrict__ logits, int64_t vocab, const int32_t* __restrict__ rows,
                         const int32_t* __restrict__ offsets, const LogitAdjustment* __restrict__ adjustments,
                         float* __restrict__ original) {
  const int64_t i = blockIdx.x;
  float* row = logits + static_cast<int64_t>(rows[i]) * vocab;
  for (int64_t k = offsets[i] + threadIdx.x; k < offsets[i + 1]; k += kAdjustThreads) {
    const LogitAdjustment a = adjustments[k];
    if (a.token < 0 || a.token >= vocab) continue;  // checked on the host; never written out of the row
    const float before = row[a.token];
    if (original) original[k] = before;
    // The host's float operations one by one: the _rn intrinsics are never contracted into a fused multiply-add.
    float x = __fadd_rn(before, a.bias);
    if (a.repetition != 1.0f) x = x > 0.0f ? __fdiv_rn(x, a.repetition) : __fmul_rn(x, a.repetition);
    row[a.token] = __fadd_rn(x, a.add);
  }
}

__global__ void __launch_bounds__(kMinPThreads)
    min_p_kernel(float* __restrict__ logits, int64_t vocab, const int32_t* __restrict__ rows,
                 const double* __restrict__ log_offsets) {
  using Reduce = cub::BlockReduce<float, kMinPThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float s_max;
  const int64_t i = blockIdx.x;
  float* row = logits + static_cast<int64_t>(rows[i]) * vocab;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += kMinPThreads) m = fmaxf(m, row[v]);  // fmaxf skips NaN, as `>` does
  const float block_max = Reduce(temp).Reduce(m, MaxOp());
  if (threadIdx.x == 0) s_max = block_max;
  __syncthreads();
  const float max = s_max;
  if (!isfinite(max)) return;
  const double threshold = __dadd_rn(static_cast<double>(max), log_offsets[i]);
  for (int64_t v = threadIdx.x; v < vocab; v += kMinPThreads)
    if (static_cast<double>(row[v]) < threshold) row[v] = -INFINITY;
}

}  // namespace

Status adjust_logits(float* logits, int64_t vocab, const int32_t* rows, const int32_t* offsets,
                     const LogitAdjustment* adjustments, float* original, int64_t num_rows, StreamHandle stream) {
  if (num_rows == 0) return ok_status();
  if (!logits || !rows || !offsets || !adjustments || vocab <= 0 || num_rows < 0 || num_rows > INT32_MAX)
    return invalid_argument("cuda::adjust_logits: need logits, rows, offsets, adjustments and a vocabulary");
  adjust_logits_kernel<<<static_cast<unsigned>(num_rows), kAdjustThreads, 0, stream>>>(logits, vocab, rows, offsets,
                                                                                       adjustments, original);
  return check_launch("cuda::adjust_logits");
}

Status apply_min_p_rows(float* logits, int64_t vocab, const int32_t* rows, const double* log_offsets,
                        int64_t num_rows, StreamHandle stream) {
  if (num_rows == 0) return ok_status();
  if (!logits || !rows || !log_offsets || vocab <= 0 || num_rows < 0 || num_rows > INT32_MAX)
    return invalid_argument("cuda::apply_min_p_rows: need logits, rows, offsets and a vocabulary");
  min_p_kernel<<<static_cast<unsigned>(num_rows), kMinPThreads, 0, stream>>>(logits, vocab, rows, log_offsets);
  return check_launch("cuda::apply_min_p_rows");
}

}  // namespace kiln::cuda
