#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/moe_experts.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kWarps = 8;          // per expert-tile block; the warps split k
constexpr int kUnroll = 4;         // 32-wide k chunks each warp has in flight per round (8 16-byte loads per lane)
constexpr int kMaxTokenTiles = 8;  // n8 tiles per pass over a weight tile: up to 64 rows of one expert at once

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

// One block = one 16-row weight tile of one active expert (grid: tiles × active-expert slots), applied to all of
// that expert's rows, up to kNT·8 per pass: the skinny-GEMM scheme (skinny_gemm.cu) with W rows as the mma's M
// and the expert's token rows as N. Lane (g, c) loads 8 consecutive k of tile rows g and g + 8 per 32-wide chunk
// (one 16-byte load each) and of input row g of each n8 tile; the mma k order is the same permutation for both
// operands. Warps split k; their partials are summed in shared memory in warp order, so results do not depend
// on timing. kGateUp: tile row g is gate row u0 + g and row g + 8 is up row u0 + g (u0 = 8 · tile), so the
// epilogue has both halves of SwiGLU for unit u0 + g at hand and writes h; else tile rows are 16 consecutive
// rows of down and the epilogue writes route_weight · y.
template <bool kGateUp, int kNT>
__global__ void __launch_bounds__(kWarps * 32, kNT <= 2 ? 3 : 2) expert_tile_kernel(
    const uint16_t* __restrict__ x, int top_k, int in_dim, const uint16_t* __restrict__ w, int out_dim,
    MoeDispatch d, const float* __restrict__ route_weight, float limit, void* __restrict__ out) {
  extern __shared__ float s_part[];  // [kWarps][kNT][4][32]
  __shared__ int s_pair[kNT * 8];     // this pass's pairs and their output scales, for the epilogue
  __shared__ float s_scale[kNT * 8];
  constexpr int kPerWarp = kNT * 4 * 32;
  const int e = d.active_experts[blockIdx.y];
  if (e < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int weight_rows = kGateUp ? 2 * out_dim : out_dim;
  const uint16_t* we = w + static_cast<int64_t>(e) * weight_rows * in_dim;
  // Rows past the end re-read the last row; their results are dropped.
  const int tile_row0 = blockIdx.x * (kGateUp ? 8 : 16);
  const uint16_t* w_row[2];
  if constexpr (kGateUp) {
    const int unit = min(tile_row0 + g, out_dim - 1);
    w_row[0] = we + static_cast<int64_t>(unit) * in_dim + 8 * c;
    w_row[1] = we + static_cast<int64_t>(out_dim + unit) * in_dim + 8 * c;
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      w_row[h] = we + static_cast<int64_t>(min(tile_row0 + g + 8 * h, out_dim - 1)) * in_dim + 8 * c;
  }
  const int chunks = (in_dim + 31) / 32;
  uint4 wv[kUnroll][2];
  bool valid[kUnroll];
  auto load_round = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = (base + u * kWarps) * 32;
      valid[u] = k + 8 * c < in_dim;  // in_dim % 8 == 0: a lane's 8 values are all inside or all outside
#pragma unroll
      for (int h = 0; h < 2; ++h) wv[u][h] = valid[u] ? load_stream(w_row[h] + k) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first round's weight loads go out before the expert's row list is read (an active expert has rows), so
  // the two dependent index loads overlap the weight latency.
  load_round(warp);
  bool loaded = true;
  const int begin = d.expert_offsets[e], end = d.expert_offsets[e + 1];

  for (int pass = begin; pass < end; pass += kNT * 8) {
    const int count = min(kNT * 8, end - pass);
    const int ntiles = (count + 7) / 8;  // block-uniform: n8 tiles past it are skipped
    if (threadIdx.x < count) {
      const int pair = d.pair_order[pass + threadIdx.x];
      s_pair[threadIdx.x] = pair;
      s_scale[threadIdx.x] = !kGateUp && route_weight ? route_weight[pair] : 1.0f;
    }
    const uint16_t* x_row[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int pair = d.pair_order[pass + min(nt * 8 + g, count - 1)];
      x_row[nt] = x + static_cast<int64_t>(kGateUp ? pair / top_k : pair) * in_dim + 8 * c;
    }
    float acc[kNT][4] = {};
    for (int base = warp; base < chunks; base += kUnroll * kWarps) {
      if (!loaded) load_round(base);
      loaded = false;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int k = (base + u * kWarps) * 32;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if (nt >= ntiles) break;
          const uint4 xv = valid[u] ? __ldg(reinterpret_cast<const uint4*>(x_row[nt] + k)) : make_uint4(0, 0, 0, 0);
          const uint4 a = wv[u][0], b = wv[u][1];
          mma_bf16_16816(acc[nt], a.x, b.x, a.y, b.y, xv.x, xv.y);
          mma_bf16_16816(acc[nt], a.z, b.z, a.w, b.w, xv.z, xv.w);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      if (nt >= ntiles) break;
#pragma unroll
      for (int r = 0; r < 4; ++r) s_part[warp * kPerWarp + (nt * 4 + r) * 32 + lane] = acc[nt][r];
    }
    __syncthreads();
    // Accumulator element (tile row rr, token j) sits at fragment ((j/8)·4 + (rr/8)·2 + j%2, lane (rr%8)·4 + (j%8)/2).
    auto part_sum = [&](int rr, int j) {
      const int idx = ((j / 8) * 4 + (rr / 8) * 2 + j % 2) * 32 + (rr % 8) * 4 + (j % 8) / 2;
      float s = 0.f;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) s += s_part[wi * kPerWarp + idx];
      return s;
    };
    if constexpr (kGateUp) {
      for (int i = threadIdx.x; i < 8 * count; i += kWarps * 32) {
        const int u = i % 8, j = i / 8;
        const int unit = tile_row0 + u;
        if (unit >= out_dim) continue;
        const float gv = fminf(part_sum(u, j), limit);
        const float uv = fminf(fmaxf(part_sum(u + 8, j), -limit), limit);
        static_cast<uint16_t*>(out)[static_cast<int64_t>(s_pair[j]) * out_dim + unit] =
            float_to_bf16_bits(gv / (1.0f + expf(-gv)) * uv);
      }
    } else {
      for (int i = threadIdx.x; i < 16 * count; i += kWarps * 32) {
        const int rr = i % 16, j = i / 16;
        const int row = tile_row0 + rr;
        if (row >= out_dim) continue;
        static_cast<float*>(out)[static_cast<int64_t>(s_pair[j]) * out_dim + row] = part_sum(rr, j) * s_scale[j];
      }
    }
    __syncthreads();  // the partials and pairs are read before the next pass overwrites them
  }
}

// n8 tiles per pass, sized by the mean rows per active expert (a decode step's experts have a few rows each;
// one with more takes several passes over its weight tile, the later ones served by the L2). Few tiles keep the
// registers low enough for 3 blocks of 8 warps per SM.
template <bool kGateUp>
void launch_tiles(const uint16_t* x, int64_t pairs, int64_t top_k, int64_t in_dim, const uint16_t* w,
                  int64_t out_dim, int64_t num_experts, const MoeDispatch& d, const float* route_weight, float limit,
                  void* out, StreamHandle stream) {
  const int64_t tiles = kGateUp ? (out_dim + 7) / 8 : (out_dim + 15) / 16;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min(pairs, num_experts)));
  const int64_t mean_rows = pairs / std::min(pairs, num_experts);
  const int64_t token_tiles = pairs <= 8 ? 1 : std::min<int64_t>(std::max<int64_t>(2, (mean_rows + 7) / 8), kMaxTokenTiles);
  auto go = [&](auto nt) {
    constexpr int kNT = decltype(nt)::value;
    const size_t smem = sizeof(float) * kWarps * kNT * 4 * 32;
    expert_tile_kernel<kGateUp, kNT><<<grid, kWarps * 32, smem, stream>>>(
        x, static_cast<int>(top_k), static_cast<int>(in_dim), w, static_cast<int>(out_dim), d, route_weight, limit,
        out);
  };
  if (token_tiles <= 1)
    go(std::integral_constant<int, 1>{});
  else if (token_tiles <= 2)
    go(std::integral_constant<int, 2>{});
  else if (token_tiles <= 4)
    go(std::integral_constant<int, 4>{});
  else
    go(std::integral_constant<int, kMaxTokenTiles>{});
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

bool fits_int(int64_t v) { return v > 0 && v <= INT32_MAX; }

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
  if (hidden % 8 != 0 || !fits_int(hidden) || !fits_int(2 * inter) || top_k <= 0 || !aligned16(x) ||
      !aligned16(gate_up))
    return invalid_argument(
        "cuda::moe_gate_up_swiglu_bf16: hidden must be a multiple of 8, inter > 0 and x / weights 16-byte aligned");
  if (n <= 0) return ok_status();
  if (!fits_int(n * top_k)) return invalid_argument("cuda::moe_gate_up_swiglu_bf16: too many pairs");
  launch_tiles<true>(x, n * top_k, top_k, hidden, gate_up, inter, num_experts, d, nullptr, limit, h, stream);
  return check_launch("cuda::moe_gate_up_swiglu_bf16");
}

Status moe_down_bf16(const uint16_t* h, int64_t pairs, int64_t inter, int64_t hidden, const uint16_t* down,
                     int64_t num_experts, const MoeDispatch& d, const float* route_weight, float* y,
                     StreamHandle stream) {
  if (inter % 8 != 0 || !fits_int(inter) || !fits_int(hidden) || !aligned16(h) || !aligned16(down))
    return invalid_argument("cuda::moe_down_bf16: inter must be a multiple of 8 and h / weights 16-byte aligned");
  if (pairs <= 0) return ok_status();
  if (!fits_int(pairs)) return invalid_argument("cuda::moe_down_bf16: too many pairs");
  launch_tiles<false>(h, pairs, 1, inter, down, hidden, num_experts, d, route_weight, 0.f, y, stream);
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
