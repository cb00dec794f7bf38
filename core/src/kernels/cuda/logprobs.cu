#include <cmath>
#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/logprobs.h"

namespace kiln::cuda {
namespace {

constexpr int kStatsThreads = 512;
constexpr int kGatherThreads = 128;

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__global__ void __launch_bounds__(kStatsThreads)
    logprob_stats_kernel(const float* __restrict__ logits, int64_t vocab, const int32_t* __restrict__ rows,
                         const int32_t* __restrict__ top_ids, int64_t top_n, double* __restrict__ log_z,
                         float* __restrict__ top_values) {
  __shared__ union {
    cub::BlockReduce<float, kStatsThreads>::TempStorage max;
    cub::BlockReduce<double, kStatsThreads>::TempStorage sum;
  } temp;
  __shared__ float s_max;
  const int64_t i = blockIdx.x;
  const float* row = logits + static_cast<int64_t>(rows[i]) * vocab;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += kStatsThreads) m = fmaxf(m, row[v]);
  const float block_max = cub::BlockReduce<float, kStatsThreads>(temp.max).Reduce(m, MaxOp());
  if (threadIdx.x == 0) s_max = block_max;
  __syncthreads();
  const double max = static_cast<double>(s_max);
  double part = 0.0;
  for (int64_t v = threadIdx.x; v < vocab; v += kStatsThreads) part += exp(static_cast<double>(row[v]) - max);
  const double sum = cub::BlockReduce<double, kStatsThreads>(temp.sum).Sum(part);
  if (threadIdx.x == 0) log_z[i] = max + log(sum);
  for (int64_t j = threadIdx.x; j < top_n; j += kStatsThreads) {
    const int32_t id = top_ids[i * top_n + j];
    top_values[i * top_n + j] = id >= 0 && id < vocab ? row[id] : NAN;
  }
}

__global__ void __launch_bounds__(kGatherThreads) selected_logits_kernel(const SelectedLogitsArgs a) {
  const int64_t width = a.max_drafts + 1;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * kGatherThreads + threadIdx.x;
  if (slot >= a.num_seqs * width) return;
  const int64_t s = slot / width, t = slot % width;
  const int32_t lp = a.logprob_row[s];
  if (lp < 0 || t > a.accepted[s]) return;
  const int32_t token = a.tokens[slot];
  if (token < 0 || token >= a.vocab) return;
  const int64_t row = static_cast<int64_t>(a.seqs[s].first_row) + t;
  float value = a.logits[row * a.vocab + token];
  if (a.adjusted_row[s] >= 0) {
    // The row's adjustments are ascending by token: a binary search finds the selected token's, if it has one.
    const int64_t r = a.adjusted_row[s] + t;
    int32_t lo = a.adjustment_offsets[r], hi = a.adjustment_offsets[r + 1];
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (a.adjustments[mid].token < token)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo < a.adjustment_offsets[r + 1] && a.adjustments[lo].token == token) value = a.original[lo];
  }
  a.values[lp + t] = value;
}

}  // namespace

Status logprob_row_stats(const float* logits, int64_t vocab, const int32_t* rows, int64_t num_rows,
                         const int32_t* top_ids, int64_t top_n, double* log_z, float* top_values, StreamHandle stream) {
  if (num_rows == 0) return ok_status();
  if (!logits || !rows || !log_z || vocab <= 0 || num_rows < 0 || num_rows > INT32_MAX || top_n < 0 ||
      (top_n > 0 && (!top_ids || !top_values)))
    return invalid_argument("cuda::logprob_row_stats: need logits, rows, log_z (and top ids and values for top_n > 0)");
  logprob_stats_kernel<<<static_cast<unsigned>(num_rows), kStatsThreads, 0, stream>>>(logits, vocab, rows, top_ids,
                                                                                      top_n, log_z, top_values);
  return check_launch("cuda::logprob_row_stats");
}

Status selected_logits(const SelectedLogitsArgs& a, StreamHandle stream) {
  if (a.num_seqs == 0) return ok_status();
  if (!a.logits || !a.seqs || !a.tokens || !a.accepted || !a.logprob_row || !a.adjusted_row || !a.values ||
      a.vocab <= 0 || a.num_seqs < 0 || a.max_drafts < 0)
    return invalid_argument("cuda::selected_logits: missing buffers");
  const int64_t slots = a.num_seqs * (a.max_drafts + 1);
  selected_logits_kernel<<<blocks_for(slots, kGatherThreads), kGatherThreads, 0, stream>>>(a);
  return check_launch("cuda::selected_logits");
}

}  // namespace kiln::cuda
