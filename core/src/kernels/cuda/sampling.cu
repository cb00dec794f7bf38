#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/topk.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kItems = kMaxTopK / kThreads;
constexpr int kNoPick = 0x7fffffff;  // atomicMin identity for the draw

struct Best {
  float v;
  int i;  // −1: none
};

struct BestOp {
  __device__ Best operator()(const Best& a, const Best& b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (a.v != b.v) return a.v > b.v ? a : b;
    return a.i < b.i ? a : b;
  }
};

template <class Temp>
__device__ Best row_argmax(const float* row, int64_t vocab, Temp& temp) {
  Best b{0.f, -1};
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (!isnan(v)) b = BestOp()(b, Best{v, static_cast<int>(i)});
  }
  return cub::BlockReduce<Best, kThreads>(temp).Reduce(b, BestOp());
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* __restrict__ logits, int64_t vocab,
                                                          int32_t* __restrict__ out) {
  __shared__ typename cub::BlockReduce<Best, kThreads>::TempStorage temp;
  const Best b = row_argmax(logits + blockIdx.x * vocab, vocab, temp);
  if (threadIdx.x == 0) out[blockIdx.x] = b.i < 0 ? 0 : b.i;
}

// First index (in index order) whose running probability sum exceeds target; `last` when rounding leaves the
// total a hair below target. Items are blocked per thread, so the scan runs in index order.
__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int64_t vocab,
                                                          const SampleRow* __restrict__ params,
                                                          const int32_t* __restrict__ candidates, int64_t n_cand,
                                                          int32_t* __restrict__ out) {
  using Reduce = cub::BlockReduce<Best, kThreads>;
  using SumD = cub::BlockReduce<double, kThreads>;
  using ScanD = cub::BlockScan<double, kThreads>;
  using Sort = cub::BlockRadixSort<int, kThreads, kItems, float>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename SumD::TempStorage sum;
    typename ScanD::TempStorage scan;
    typename Sort::TempStorage sort;
  } temp;
  __shared__ Best s_best;
  __shared__ double s_total, s_carry;
  __shared__ int s_pick, s_keep;

  const int64_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  const SampleRow pr = params[row];
  const Best best = row_argmax(l, vocab, temp.reduce);
  if (threadIdx.x == 0) s_best = best;
  __syncthreads();
  const int greedy = s_best.i < 0 ? 0 : s_best.i;
  if (pr.temperature <= 0.f || pr.top_k == 1) {
    if (threadIdx.x == 0) out[row] = greedy;
    return;
  }
  const double inv_t = 1.0 / static_cast<double>(pr.temperature);
  const double max_scaled = static_cast<double>(l[greedy]) * inv_t;
  const bool use_top_k = pr.top_k > 0 && pr.top_k < vocab;
  const bool use_top_p = pr.top_p < 1.0f;
  if (threadIdx.x == 0) s_pick = kNoPick;

  if (!use_top_k && !use_top_p) {
    // Whole vocabulary: weights, then probabilities as float (as the CPU stores them), then the draw.
    double part = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) part += exp(static_cast<double>(l[i]) * inv_t - max_scaled);
    const double total = SumD(temp.sum).Sum(part);
    if (threadIdx.x == 0) s_total = total;
    __syncthreads();
    const double weight_total = s_total;
    auto prob = [&](int64_t i) {
      return static_cast<double>(static_cast<float>(exp(static_cast<double>(l[i]) * inv_t - max_scaled) / weight_total));
    };
    part = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) part += prob(i);
    const double prob_total = SumD(temp.sum).Sum(part);
    if (threadIdx.x == 0) {
      s_total = pr.u * prob_total;
      s_carry = 0.0;
    }
    __syncthreads();
    const double target = s_total;
    constexpr int kChunkItems = 4;
    for (int64_t base = 0; base < vocab; base += kThreads * kChunkItems) {
      double p[kChunkItems], run[kChunkItems];
#pragma unroll
      for (int j = 0; j < kChunkItems; ++j) {
        const int64_t i = base + threadIdx.x * kChunkItems + j;
        p[j] = i < vocab ? prob(i) : 0.0;
      }
      double chunk_total;
      ScanD(temp.scan).InclusiveSum(p, run, chunk_total);
      const double carry = s_carry;
#pragma unroll
      for (int j = 0; j < kChunkItems; ++j) {
        const int64_t i = base + threadIdx.x * kChunkItems + j;
        if (i < vocab && p[j] > 0.0 && carry + run[j] > target) atomicMin(&s_pick, static_cast<int>(i));
      }
      __syncthreads();
      if (s_pick != kNoPick) break;
      if (threadIdx.x == 0) s_carry = carry + chunk_total;
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      int last = vocab - 1;
      while (last > 0 && prob(last) <= 0.0) --last;
      out[row] = s_pick != kNoPick ? s_pick : last;
    }
    return;
  }

  // Candidates (value order): top_k of them, then the nucleus prefix.
  const int64_t count = use_top_k ? min(static_cast<int64_t>(pr.top_k), n_cand) : n_cand;
  const int32_t* cand = candidates + row * n_cand;
  double w[kItems], run[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int r = threadIdx.x * kItems + j;
    w[j] = r < count ? exp(static_cast<double>(l[cand[r]]) * inv_t - max_scaled) : 0.0;
  }
  double total;
  ScanD(temp.scan).InclusiveSum(w, run, total);
  __syncthreads();
  if (!use_top_k) {
    // The nucleus is measured against the whole vocabulary's mass, as on the CPU.
    double part = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) part += exp(static_cast<double>(l[i]) * inv_t - max_scaled);
    const double all = SumD(temp.sum).Sum(part);
    if (threadIdx.x == 0) s_total = all;
    __syncthreads();
    total = s_total;
  }
  if (threadIdx.x == 0) s_keep = static_cast<int>(count);
  __syncthreads();
  if (use_top_p) {
    // Candidate r is kept while the mass before it is < top_p (and always the first).
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int r = threadIdx.x * kItems + j;
      if (r < count && r > 0 && (run[j] - w[j]) / total >= pr.top_p) atomicMin(&s_keep, r);
    }
    __syncthreads();
  }
  const int keep = s_keep;
  double kept_part = 0.0;
#pragma unroll
  for (int j = 0; j < kItems; ++j)
    if (threadIdx.x * kItems + j < keep) kept_part += w[j];
  const double kept_total = SumD(temp.sum).Sum(kept_part);
  if (threadIdx.x == 0) s_total = kept_total;
  __syncthreads();
  // Back to index order for the draw.
  int idx[kItems];
  float prob[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int r = threadIdx.x * kItems + j;
    idx[j] = r < keep ? cand[r] : 0x7fffffff;
    prob[j] = r < keep ? static_cast<float>(w[j] / s_total) : 0.f;
  }
  __syncthreads();
  Sort(temp.sort).Sort(idx, prob);
  __syncthreads();
  double pd[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) pd[j] = prob[j];
  double prob_total;
  ScanD(temp.scan).InclusiveSum(pd, run, prob_total);
  const double target = pr.u * prob_total;
#pragma unroll
  for (int j = 0; j < kItems; ++j)
    if (idx[j] != 0x7fffffff && pd[j] > 0.0 && run[j] > target) atomicMin(&s_pick, idx[j]);
  __syncthreads();
  if (threadIdx.x == 0) {
    // The last kept index when rounding leaves the sum below target: the largest kept id.
    int last = 0;
    for (int r = 0; r < keep; ++r) last = max(last, static_cast<int>(cand[r]));
    out[row] = s_pick != kNoPick ? s_pick : last;
  }
}

}  // namespace

Status argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, StreamHandle stream) {
  if (vocab <= 0 || vocab > INT32_MAX) return invalid_argument("cuda::argmax_rows: vocab out of range");
  if (rows <= 0) return ok_status();
  argmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, out);
  return check_launch("cuda::argmax_rows");
}

size_t sample_workspace_bytes(int64_t rows, int64_t max_candidates) {
  return sizeof(int32_t) * static_cast<size_t>(rows * max_candidates);
}

Status sample_rows(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int64_t max_candidates,
                   void* workspace, int32_t* out, StreamHandle stream) {
  if (vocab <= 0 || vocab > INT32_MAX) return invalid_argument("cuda::sample_rows: vocab out of range");
  if (max_candidates < 0 || max_candidates > kMaxTopK)
    return invalid_argument("cuda::sample_rows: max_candidates must be in [0, 2048]");
  if (rows <= 0) return ok_status();
  const int64_t n_cand = std::min(max_candidates, vocab);
  auto* candidates = static_cast<int32_t*>(workspace);
  if (n_cand > 0) KILN_RETURN_IF_ERROR(topk_rows(logits, rows, vocab, n_cand, -1, candidates, stream));
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, params, candidates, n_cand, out);
  return check_launch("cuda::sample_rows");
}

}  // namespace kiln::cuda
