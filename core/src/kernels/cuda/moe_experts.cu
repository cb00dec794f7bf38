#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/moe_experts.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kWarps = 4;          // per GEMV block
constexpr int kUnitsPerWarp = 4;   // a unit = two weight rows (the narrow grid: many pairs)
constexpr int kLoadsInFlight = 8;  // the wide grid: 16-byte weight loads per lane and row before the first is used
// Up to this many pairs (one or two decode tokens) the wide grid runs: one unit per warp, 4× the blocks. Measured on
// the H200 (group + gate_up + down + combine): one token 45.6 µs wide vs 56.1 narrow; 4 and 16 tokens 108.5 / 304.8
// wide vs 100.5 / 223.8 narrow, where the narrow grid already has ≥ 10 blocks per SM.
constexpr int64_t kWideGridMaxPairs = 8;
constexpr int kTokensPerPass = 4;  // tokens of one expert sharing each weight load

// One block; warp w < kSlices owns the w-th contiguous slice of the pairs. Pass 1: each of those warps counts its
// slice per expert (lanes with the same id found by __match_any_sync). Then thread e turns the counts into each
// slice's first slot in expert e's group, and block scans give offsets and the active list. Pass 2: each slice's
// warp writes its pairs at its cursors. Slices in pair order and lanes in pair order keep pair order within an
// expert (deterministic), and a warp reads pairs / kSlices ids: prefill's tens of thousands of pairs stay cheap.
// kSlices · kMaxExperts ints stay within the 48 KiB of static shared memory.
constexpr int kSlices = 8;

__global__ void __launch_bounds__(kMaxExperts) group_kernel(const int32_t* __restrict__ ids, int64_t pairs,
                                                            int experts, MoeDispatch d) {
  using Scan = cub::BlockScan<int, kMaxExperts>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int cursor[kSlices * kMaxExperts];  // [slice][expert]: the slice's pair count, then its write cursor
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < kSlices * experts; i += blockDim.x) cursor[i] = 0;
  __syncthreads();
  const int64_t slice = (pairs + kSlices - 1) / kSlices;
  // Warps past the last slice get an empty one.
  const int64_t slice_begin = min(pairs, warp * slice), slice_end = warp < kSlices ? min(pairs, slice_begin + slice) : 0;
  int* mine = cursor + min(warp, kSlices - 1) * experts;
  auto id_at = [&](int64_t p) {
    const int id = p < slice_end ? ids[p] : -1;
    return id >= 0 && id < experts ? id : -1;  // out-of-range ids are left out
  };
  for (int64_t base = slice_begin; base < slice_end; base += 32) {
    const int id = id_at(base + lane);
    const unsigned same = __match_any_sync(~0u, id);
    if (id >= 0 && lane == __ffs(same) - 1) mine[id] += __popc(same);
    __syncwarp();
  }
  __syncthreads();

  const int e = threadIdx.x;
  int count = 0;
  if (e < experts)
    for (int w = 0; w < kSlices; ++w) count += cursor[w * experts + e];
  int offset = 0, total = 0;
  Scan(temp).ExclusiveSum(count, offset, total);
  __syncthreads();
  int rank = 0;
  Scan(temp).ExclusiveSum(count > 0 ? 1 : 0, rank);
  if (e < experts) {
    d.expert_offsets[e] = offset;
    d.active_experts[e] = -1;
  }
  if (e == 0) d.expert_offsets[experts] = total;
  __syncthreads();
  if (e < experts) {
    if (count > 0) d.active_experts[rank] = e;
    int next = offset;
    for (int w = 0; w < kSlices; ++w) {
      const int c = cursor[w * experts + e];
      cursor[w * experts + e] = next;
      next += c;
    }
  }
  __syncthreads();

  const unsigned lanes_below = (1u << lane) - 1;
  for (int64_t base = slice_begin; base < slice_end; base += 32) {
    const int id = id_at(base + lane);
    const unsigned same = __match_any_sync(~0u, id);
    if (id >= 0) d.pair_order[mine[id] + __popc(same & lanes_below)] = static_cast<int32_t>(base + lane);
    __syncwarp();
    if (id >= 0 && lane == __ffs(same) - 1) mine[id] += __popc(same);
    __syncwarp();
  }
}

__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) {
  float wf[8], xf[8];
  bf16x8_to_float(w, wf);
  bf16x8_to_float(x, xf);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(wf[i], xf[i], s);
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(~0u, v, off);
  return v;
}

// One unit of two weight rows of expert e against the expert's pairs [begin, end), kTokensPerPass input rows per
// pass over the rows (16-byte loads, lanes on consecutive words). kGateUp: rows (r, inter + r) → silu·up into h;
// else rows (2u, 2u + 1) → scaled fp32 outputs. kWide: all kLoadsInFlight loads of a lane are issued before the
// first is used (the one-token grid has few warps, each must keep many bytes in flight); else the loop is
// unrolled 4 deep and each warp runs kUnitsPerWarp units in turn.
template <bool kGateUp, bool kWide>
__device__ __forceinline__ void expert_unit(const uint16_t* __restrict__ x, int64_t top_k, int64_t in_dim,
                                            int64_t unit, const uint16_t* __restrict__ we, const MoeDispatch& d,
                                            int begin, int end, const float* __restrict__ route_weight, float limit,
                                            void* out, int64_t out_dim, int lane) {
  const int64_t chunks = in_dim / 8;
  const int64_t r0 = kGateUp ? unit : 2 * unit;
  const int64_t r1 = kGateUp ? out_dim + unit : min(2 * unit + 1, out_dim - 1);
  const uint4* w0 = reinterpret_cast<const uint4*>(we + r0 * in_dim);
  const uint4* w1 = reinterpret_cast<const uint4*>(we + r1 * in_dim);
  for (int base = begin; base < end; base += kTokensPerPass) {
    const int count = min(kTokensPerPass, end - base);
    const uint4* xr[kTokensPerPass];
    int pair[kTokensPerPass];
#pragma unroll
    for (int k = 0; k < kTokensPerPass; ++k) {
      pair[k] = d.pair_order[base + min(k, count - 1)];
      const int64_t xrow = kGateUp ? pair[k] / top_k : pair[k];
      xr[k] = reinterpret_cast<const uint4*>(x + xrow * in_dim);
    }
    float acc0[kTokensPerPass] = {}, acc1[kTokensPerPass] = {};
    if constexpr (kWide) {
      for (int64_t ch0 = lane; ch0 < chunks; ch0 += 32 * kLoadsInFlight) {
        uint4 a[kLoadsInFlight], b[kLoadsInFlight];
#pragma unroll
        for (int i = 0; i < kLoadsInFlight; ++i) {
          const int64_t ch = ch0 + 32 * i;
          a[i] = ch < chunks ? __ldg(w0 + ch) : make_uint4(0, 0, 0, 0);
          b[i] = ch < chunks ? __ldg(w1 + ch) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < kTokensPerPass; ++k) {
          if (k >= count) break;
#pragma unroll
          for (int i = 0; i < kLoadsInFlight; ++i) {
            const int64_t ch = ch0 + 32 * i;
            if (ch >= chunks) break;
            const uint4 xv = __ldg(xr[k] + ch);
            acc0[k] += dot8(a[i], xv);
            acc1[k] += dot8(b[i], xv);
          }
        }
      }
    } else {
#pragma unroll 4
      for (int64_t ch = lane; ch < chunks; ch += 32) {
        const uint4 a = __ldg(w0 + ch);
        const uint4 b = __ldg(w1 + ch);
#pragma unroll
        for (int k = 0; k < kTokensPerPass; ++k) {
          if (k < count) {
            const uint4 xv = __ldg(xr[k] + ch);
            acc0[k] += dot8(a, xv);
            acc1[k] += dot8(b, xv);
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kTokensPerPass; ++k) {
      if (k >= count) break;
      const float s0 = warp_sum(acc0[k]);
      const float s1 = warp_sum(acc1[k]);
      if (lane != 0) continue;
      if constexpr (kGateUp) {
        const float gv = fminf(s0, limit);
        const float uv = fminf(fmaxf(s1, -limit), limit);
        static_cast<uint16_t*>(out)[static_cast<int64_t>(pair[k]) * out_dim + unit] =
            float_to_bf16_bits(gv / (1.0f + expf(-gv)) * uv);
      } else {
        const float scale = route_weight ? route_weight[pair[k]] : 1.0f;
        float* y = static_cast<float*>(out) + static_cast<int64_t>(pair[k]) * out_dim;
        y[r0] = s0 * scale;
        if (r1 != r0) y[r1] = s1 * scale;
      }
    }
  }
}

template <bool kWide>
constexpr int64_t units_per_block() {
  return kWarps * (kWide ? 1 : kUnitsPerWarp);
}

// grid: (row blocks, active-expert slot); each warp owns units_per_block / kWarps consecutive units.
template <bool kGateUp, bool kWide>
__global__ void __launch_bounds__(kWarps * 32) expert_gemv_kernel(
    const uint16_t* __restrict__ x, int64_t top_k, int64_t in_dim, int64_t units, const uint16_t* __restrict__ w,
    int64_t weight_rows, MoeDispatch d, const float* __restrict__ route_weight, float limit, void* out,
    int64_t out_dim) {
  const int e = d.active_experts[blockIdx.y];
  if (e < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int begin = d.expert_offsets[e], end = d.expert_offsets[e + 1];
  const uint16_t* we = w + static_cast<int64_t>(e) * weight_rows * in_dim;
  constexpr int64_t kUnits = units_per_block<kWide>() / kWarps;
  for (int64_t uu = 0; uu < kUnits; ++uu) {
    const int64_t unit = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kUnits + uu;
    if (unit >= units) return;
    expert_unit<kGateUp, kWide>(x, top_k, in_dim, unit, we, d, begin, end, route_weight, limit, out, out_dim, lane);
  }
}

__global__ void combine_kernel(const float* __restrict__ y, int64_t n, int64_t top_k, int64_t hidden,
                               const uint16_t* __restrict__ add, uint16_t* __restrict__ out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * hidden) return;
  const int64_t t = idx / hidden, i = idx % hidden;
  float s = 0.f;
  for (int64_t j = 0; j < top_k; ++j) s += y[(t * top_k + j) * hidden + i];
  if (add) s += bf16_bits_to_float(add[idx]);
  out[idx] = float_to_bf16_bits(s);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t active_slots(int64_t pairs, int64_t num_experts) { return std::min<int64_t>(pairs, num_experts); }

}  // namespace

Status moe_group_by_expert(const int32_t* ids, int64_t pairs, int64_t num_experts, const MoeDispatch& d,
                           StreamHandle stream) {
  if (num_experts <= 0 || num_experts > kMaxExperts)
    return invalid_argument("cuda::moe_group_by_expert: num_experts must be in [1, 1024]");
  if (pairs < 0) return invalid_argument("cuda::moe_group_by_expert: pairs < 0");
  group_kernel<<<1, kMaxExperts, 0, stream>>>(ids, pairs, static_cast<int>(num_experts), d);
  return check_launch("cuda::moe_group_by_expert");
}

Status moe_gate_up_swiglu_bf16(const uint16_t* x, int64_t n, int64_t top_k, int64_t hidden, int64_t inter,
                               const uint16_t* gate_up, int64_t num_experts, const MoeDispatch& d, float limit,
                               uint16_t* h, StreamHandle stream) {
  if (hidden % 8 != 0 || inter <= 0 || top_k <= 0 || !aligned16(x) || !aligned16(gate_up))
    return invalid_argument("cuda::moe_gate_up_swiglu_bf16: hidden must be a multiple of 8 and x / weights 16-byte aligned");
  if (n <= 0) return ok_status();
  const int64_t slots = active_slots(n * top_k, num_experts);
  auto launch = [&](auto wide) {
    constexpr bool kWide = decltype(wide)::value;
    const dim3 grid(static_cast<unsigned>((inter + units_per_block<kWide>() - 1) / units_per_block<kWide>()),
                    static_cast<unsigned>(slots));
    expert_gemv_kernel<true, kWide><<<grid, kWarps * 32, 0, stream>>>(x, top_k, hidden, inter, gate_up, 2 * inter, d,
                                                                      nullptr, limit, h, inter);
  };
  if (n * top_k <= kWideGridMaxPairs)
    launch(std::true_type{});
  else
    launch(std::false_type{});
  return check_launch("cuda::moe_gate_up_swiglu_bf16");
}

Status moe_down_bf16(const uint16_t* h, int64_t pairs, int64_t inter, int64_t hidden, const uint16_t* down,
                     int64_t num_experts, const MoeDispatch& d, const float* route_weight, float* y,
                     StreamHandle stream) {
  if (inter % 8 != 0 || hidden <= 0 || !aligned16(h) || !aligned16(down))
    return invalid_argument("cuda::moe_down_bf16: inter must be a multiple of 8 and h / weights 16-byte aligned");
  if (pairs <= 0) return ok_status();
  const int64_t units = (hidden + 1) / 2;
  const int64_t slots = active_slots(pairs, num_experts);
  auto launch = [&](auto wide) {
    constexpr bool kWide = decltype(wide)::value;
    const dim3 grid(static_cast<unsigned>((units + units_per_block<kWide>() - 1) / units_per_block<kWide>()),
                    static_cast<unsigned>(slots));
    expert_gemv_kernel<false, kWide><<<grid, kWarps * 32, 0, stream>>>(h, 1, inter, units, down, hidden, d,
                                                                       route_weight, 0.f, y, hidden);
  };
  if (pairs <= kWideGridMaxPairs)
    launch(std::true_type{});
  else
    launch(std::false_type{});
  return check_launch("cuda::moe_down_bf16");
}

Status moe_combine_bf16(const float* y, int64_t n, int64_t top_k, int64_t hidden, const uint16_t* add, uint16_t* out,
                        StreamHandle stream) {
  if (n < 0 || top_k <= 0 || hidden <= 0) return invalid_argument("cuda::moe_combine_bf16: bad shape");
  if (n == 0) return ok_status();
  constexpr int kThreads = 256;
  combine_kernel<<<blocks_for(n * hidden, kThreads), kThreads, 0, stream>>>(y, n, top_k, hidden, add, out);
  return check_launch("cuda::moe_combine_bf16");
}

}  // namespace kiln::cuda
