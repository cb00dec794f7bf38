#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/topk.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kSortItems = kMaxTopK / kThreads;
constexpr int kScanItems = 8;

// Order-preserving key: larger float → larger key; NaN → 0 (below −inf); −0 and +0 equal.
__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  uint32_t b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__global__ void __launch_bounds__(kThreads) topk_kernel(const float* __restrict__ values, int64_t n, int k_out,
                                                        int64_t causal_offset, const int32_t* __restrict__ row_ids,
                                                        int32_t* __restrict__ out) {
  using Sort = cub::BlockRadixSort<uint32_t, kThreads, kSortItems, int>;
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename Scan::TempStorage scan;
  } temp;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining;
  __shared__ uint32_t s_keys[kMaxTopK];
  __shared__ int s_idx[kMaxTopK];

  const int64_t row = blockIdx.x;
  const float* v = values + (row_ids ? static_cast<int64_t>(row_ids[row]) : row) * n;
  const int64_t causal = causal_offset + row + 1;
  const int64_t visible = causal_offset >= 0 && causal < n ? causal : n;
  const int k = static_cast<int>(visible < k_out ? visible : k_out);
  int32_t* o = out + row * k_out;
  for (int i = threadIdx.x + k; i < k_out; i += kThreads) o[i] = -1;
  if (k <= 0) return;

  // Radix select: the k-th largest key, 8 bits at a time from the top.
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < visible; i += kThreads) {
      const uint32_t key = order_key(v[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xff], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, b = 255;
      for (; b > 0 && above + hist[b] < remaining; --b) above += hist[b];
      s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
      s_remaining = remaining - above;
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 0xffu << shift;
  }
  const uint32_t threshold = prefix;  // `remaining` of the keys equal to it are taken: the lowest indices

  // Compaction in index order (blocked arrangement keeps it).
  int taken_before = 0, ties_before = 0;
  for (int64_t base = 0; base < visible; base += static_cast<int64_t>(kThreads) * kScanItems) {
    int tie[kScanItems], tie_rank[kScanItems], take[kScanItems], pos[kScanItems];
    uint32_t keys[kScanItems];
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      const int64_t i = base + threadIdx.x * kScanItems + j;
      keys[j] = i < visible ? order_key(v[i]) : 0u;
      tie[j] = i < visible && keys[j] == threshold;
    }
    int ties_total;
    Scan(temp.scan).ExclusiveSum(tie, tie_rank, ties_total);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      const int64_t i = base + threadIdx.x * kScanItems + j;
      take[j] = i < visible && (keys[j] > threshold || (tie[j] && ties_before + tie_rank[j] < remaining));
    }
    int taken_total;
    Scan(temp.scan).ExclusiveSum(take, pos, taken_total);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      if (take[j]) {
        s_keys[taken_before + pos[j]] = keys[j];
        s_idx[taken_before + pos[j]] = static_cast<int>(base + threadIdx.x * kScanItems + j);
      }
    }
    taken_before += taken_total;
    ties_before += ties_total;
  }
  __syncthreads();

  uint32_t keys[kSortItems];
  int idx[kSortItems];
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) {
    const int r = threadIdx.x * kSortItems + j;
    keys[j] = r < k ? s_keys[r] : 0u;
    idx[j] = r < k ? s_idx[r] : 0x7fffffff;
  }
  Sort(temp.sort).SortDescending(keys, idx);
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) {
    const int r = threadIdx.x * kSortItems + j;
    if (r < k) o[r] = idx[j];
  }
}

}  // namespace

Status topk_rows(const float* values, int64_t rows, int64_t n, int64_t k, int64_t causal_offset, int32_t* out,
                 StreamHandle stream) {
  if (k <= 0 || k > kMaxTopK || n <= 0 || n > INT32_MAX)
    return invalid_argument("cuda::topk_rows: need 0 < k ≤ 2048 and 0 < n < 2^31, got k=" + std::to_string(k));
  if (rows <= 0) return ok_status();
  topk_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(values, n, static_cast<int>(k), causal_offset,
                                                                    nullptr, out);
  return check_launch("cuda::topk_rows");
}

Status topk_listed_rows(const float* values, const int32_t* row_ids, int64_t rows, int64_t n, int64_t k, int32_t* out,
                        StreamHandle stream) {
  if (k <= 0 || k > kMaxTopK || n <= 0 || n > INT32_MAX)
    return invalid_argument("cuda::topk_listed_rows: need 0 < k ≤ 2048 and 0 < n < 2^31, got k=" + std::to_string(k));
  if (rows <= 0) return ok_status();
  if (!values || !row_ids || !out || rows > INT32_MAX)
    return invalid_argument("cuda::topk_listed_rows: need values, row ids, out and fewer than 2^31 rows");
  topk_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(values, n, static_cast<int>(k), -1, row_ids, out);
  return check_launch("cuda::topk_listed_rows");
}

}  // namespace kiln::cuda
