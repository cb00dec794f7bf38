#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/pdl.cuh"
#include "kiln/cuda/moe_combine_norm_row.cuh"

namespace kiln::cuda {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kWarps = 8;          // per expert-tile block; the warps split k
constexpr int kUnroll = 4;         // 32-wide k chunks each warp has in flight per round (8 16-byte loads per lane)
constexpr int kTileMinBlocks = 3;  // blocks of kWarps per SM the registers allow at up to 2 n8 tiles
constexpr int kMaxTokenTiles = 8;  // n8 tiles per pass over a weight tile: up to 64 rows of one expert at once

// One block; warp w < slices owns the w-th contiguous slice of the pairs. Pass 1: each of those warps counts its
// slice per expert (lanes with the same id found by __match_any_sync). Then thread e turns the counts into each
// slice's first slot in expert e's group, and block scans give offsets and the active list. Pass 2: each slice's
// warp writes its pairs at its cursors. Slices in pair order and lanes in pair order keep pair order within an
// expert (deterministic, whatever the number of slices), and a warp reads pairs / slices ids: prefill's tens of
// thousands of pairs stay cheap. Every warp takes a slice where slices · experts ints fit kGroupSmemBudget (64
// experts: all 32; at 8 slices a 4K-token chunk's 16K pairs took 33 us a layer on an H100, a third of the router).
constexpr size_t kGroupSmemBudget = 40 * 1024;  // dynamic, beside the scan's static storage (48 KiB in all)

int group_slices(int experts) {
  return static_cast<int>(std::clamp<size_t>(kGroupSmemBudget / (sizeof(int) * experts), 1, kMaxExperts / 32));
}

__global__ void __launch_bounds__(kMaxExperts) group_kernel(const int32_t* __restrict__ ids, int64_t pairs,
                                                            int experts, int slices, MoeDispatch d) {
  using Scan = cub::BlockScan<int, kMaxExperts>;
  __shared__ typename Scan::TempStorage temp;
  extern __shared__ int cursor[];  // [slice][expert]: the slice's pair count, then its write cursor
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl_wait();
  pdl_launch_dependents();
  for (int i = threadIdx.x; i < slices * experts; i += blockDim.x) cursor[i] = 0;
  __syncthreads();
  const int64_t slice = (pairs + slices - 1) / slices;
  // Warps past the last slice get an empty one.
  const int64_t slice_begin = min(pairs, warp * slice), slice_end = warp < slices ? min(pairs, slice_begin + slice) : 0;
  int* mine = cursor + min(warp, slices - 1) * experts;
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
    for (int w = 0; w < slices; ++w) count += cursor[w * experts + e];
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
    for (int w = 0; w < slices; ++w) {
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

// One block = one 16-row weight tile of one expert slot (grid: tiles × slots), applied to all of that expert's
// rows, up to kNT·8 per pass: the skinny-GEMM scheme (skinny_gemm.cu) with W rows as the mma's M and the expert's
// token rows as N. Lane (g, c) loads 8 consecutive k of tile rows g and g + 8 per 32-wide chunk (one 16-byte load
// each) and of input row g of each n8 tile; the mma k order is the same permutation for both operands. Warps
// split k (warp w takes chunks w, w + kWarps, ... in that order); their partials are summed in shared memory in
// warp order, so a row's results depend on the weight shapes only: not on timing, nor on the other rows (batch
// invariance). kGateUp: tile row g is gate row u0 + g and row g + 8 is up row u0 + g (u0 = 8 · tile), so the
// epilogue has both halves of SwiGLU for unit u0 + g at hand and writes h; else tile rows are 16 consecutive rows
// of down and the epilogue writes route_weight · y.
//
// Slot 0 is the folded shared expert when there is one (its rows are the n tokens, in order, weight 1); slot
// s ≥ has_shared is active expert d.active_experts[s − has_shared]. The shared slot is first in the grid, so its
// blocks are the ones resident while the previous kernel finishes (PDL), with their weights on the way.
struct TileArgs {
  const uint16_t* x;  // routed rows' inputs: gate_up x [n, in] (row pair / top_k), down h [pairs, in] (row pair)
  int top_k, in_dim, out_dim;
  const uint16_t* w;  // [E, rows, in]
  MoeDispatch d;
  const float* route_weight;  // down: per pair, or null (1)
  float limit;
  void* out;                 // gate_up bf16 [pairs, out], down fp32 [pairs, out]
  const uint16_t* shared_w;  // null: no shared slot
  const uint16_t* shared_x;  // [shared_rows, in]
  void* shared_out;          // [shared_rows, out]
  int shared_rows;
};

template <bool kGateUp, int kNT>
__global__ void __launch_bounds__(kWarps * 32, kNT <= 2 ? kTileMinBlocks : 2) expert_tile_kernel(const TileArgs a) {
  extern __shared__ float s_part[];  // [kWarps][kNT][4][32]
  __shared__ int s_row[kNT * 8];     // this pass's rows (pair, or token for the shared slot) and output scales
  __shared__ float s_scale[kNT * 8];
  constexpr int kPerWarp = kNT * 4 * 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const bool shared_slot = a.shared_w != nullptr && blockIdx.y == 0;
  const int in_dim = a.in_dim, out_dim = a.out_dim;
  const int weight_rows = kGateUp ? 2 * out_dim : out_dim;
  const int tile_row0 = blockIdx.x * (kGateUp ? 8 : 16);
  // Rows past the end re-read the last row; their results are dropped.
  const uint16_t* w_row[2];
  auto set_weight_rows = [&](const uint16_t* we) {
    if constexpr (kGateUp) {
      const int unit = min(tile_row0 + g, out_dim - 1);
      w_row[0] = we + static_cast<int64_t>(unit) * in_dim + 8 * c;
      w_row[1] = we + static_cast<int64_t>(out_dim + unit) * in_dim + 8 * c;
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        w_row[h] = we + static_cast<int64_t>(min(tile_row0 + g + 8 * h, out_dim - 1)) * in_dim + 8 * c;
    }
  };
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

  // Which routed experts are active is written by the router kernel just before this one, so only the shared
  // expert's weights (read-only) can be loaded before pdl_wait(): its first round into registers and the rest
  // of its tile toward L2.
  if (shared_slot) {
    set_weight_rows(a.shared_w);
    load_round(warp);
    const int tile_rows = min(kGateUp ? 8 : 16, out_dim - tile_row0);
    const size_t tile_bytes = static_cast<size_t>(tile_rows) * in_dim * sizeof(uint16_t);
    prefetch_l2(a.shared_w + static_cast<int64_t>(tile_row0) * in_dim, tile_bytes, threadIdx.x, blockDim.x);
    if constexpr (kGateUp)
      prefetch_l2(a.shared_w + static_cast<int64_t>(out_dim + tile_row0) * in_dim, tile_bytes, threadIdx.x,
                  blockDim.x);
  }
  pdl_wait();
  pdl_launch_dependents();
  int begin = 0, end = a.shared_rows;
  if (!shared_slot) {
    const int e = a.d.active_experts[blockIdx.y - (a.shared_w != nullptr ? 1 : 0)];
    if (e < 0) return;
    set_weight_rows(a.w + static_cast<int64_t>(e) * weight_rows * in_dim);
    // The first round's weight loads go out before the expert's row list is read (an active expert has rows),
    // so the two dependent index loads overlap the weight latency.
    load_round(warp);
    begin = a.d.expert_offsets[e];
    end = a.d.expert_offsets[e + 1];
  }
  const uint16_t* x_base = shared_slot ? a.shared_x : a.x;
  auto row_at = [&](int i) { return shared_slot ? i : a.d.pair_order[i]; };
  bool loaded = true;

  for (int pass = begin; pass < end; pass += kNT * 8) {
    const int count = min(kNT * 8, end - pass);
    const int ntiles = (count + 7) / 8;  // block-uniform: n8 tiles past it are skipped
    if (threadIdx.x < count) {
      const int row = row_at(pass + threadIdx.x);
      s_row[threadIdx.x] = row;
      s_scale[threadIdx.x] = !kGateUp && !shared_slot && a.route_weight ? a.route_weight[row] : 1.0f;
    }
    const uint16_t* x_row[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int row = row_at(pass + min(nt * 8 + g, count - 1));
      const int input = kGateUp && !shared_slot ? row / a.top_k : row;
      x_row[nt] = x_base + static_cast<int64_t>(input) * in_dim + 8 * c;
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
          const uint4 wa = wv[u][0], wb = wv[u][1];
          mma_bf16_16816(acc[nt], wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
          mma_bf16_16816(acc[nt], wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
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
    void* out = shared_slot ? a.shared_out : a.out;
    if constexpr (kGateUp) {
      for (int i = threadIdx.x; i < 8 * count; i += kWarps * 32) {
        const int u = i % 8, j = i / 8;
        const int unit = tile_row0 + u;
        if (unit >= out_dim) continue;
        const float gv = fminf(part_sum(u, j), a.limit);
        const float uv = fminf(fmaxf(part_sum(u + 8, j), -a.limit), a.limit);
        static_cast<uint16_t*>(out)[static_cast<int64_t>(s_row[j]) * out_dim + unit] =
            float_to_bf16_bits(gv / (1.0f + expf(-gv)) * uv);
      }
    } else {
      for (int i = threadIdx.x; i < 16 * count; i += kWarps * 32) {
        const int rr = i % 16, j = i / 16;
        const int row = tile_row0 + rr;
        if (row >= out_dim) continue;
        static_cast<float*>(out)[static_cast<int64_t>(s_row[j]) * out_dim + row] = part_sum(rr, j) * s_scale[j];
      }
    }
    __syncthreads();  // the partials and rows are read before the next pass overwrites them
  }
}

// n8 tiles per pass, sized by the mean rows per routed expert (a decode step's experts have a few rows each;
// one with more takes several passes over its weight tile, the later ones served by the L2). The shared expert
// has all n rows but is one slot of many: it takes several passes rather than sizing every block for it (at 32
// tokens 4 n8 tiles for all cost more than the shared slot's second pass; kernel_bench moe_batched). Which kNT
// runs changes no row's results: each token column of the mma is computed on its own, in the same k order.
template <bool kGateUp>
Status launch_tiles(const TileArgs& a, int64_t pairs, int64_t num_experts, StreamHandle stream, const char* name) {
  const int64_t tiles = kGateUp ? (a.out_dim + 7) / 8 : (a.out_dim + 15) / 16;
  const int64_t routed_slots = std::min(pairs, num_experts);
  const int64_t slots = routed_slots + (a.shared_w != nullptr ? 1 : 0);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slots));
  const int64_t mean_rows = pairs / routed_slots;
  const int64_t token_tiles =
      pairs <= 8 ? 1 : std::min<int64_t>(std::max<int64_t>(2, (mean_rows + 7) / 8), kMaxTokenTiles);
  auto go = [&](auto nt) {
    constexpr int kNT = decltype(nt)::value;
    const size_t smem = sizeof(float) * kWarps * kNT * 4 * 32;
    return check_cuda(launch_pdl(expert_tile_kernel<kGateUp, kNT>, grid, dim3(kWarps * 32), smem, stream, a), name);
  };
  if (token_tiles <= 1) return go(std::integral_constant<int, 1>{});
  if (token_tiles <= 2) return go(std::integral_constant<int, 2>{});
  if (token_tiles <= 4) return go(std::integral_constant<int, 4>{});
  return go(std::integral_constant<int, kMaxTokenTiles>{});
}

// Token t's routed sum in slot order, then the folded shared expert's row, then a bf16 addend.
__device__ __forceinline__ float combined(const float* __restrict__ y, int64_t t, int64_t top_k, int64_t hidden,
                                          int64_t i, const float* __restrict__ shared_y,
                                          const uint16_t* __restrict__ add) {
  float s = 0.f;
  for (int64_t j = 0; j < top_k; ++j) s += y[(t * top_k + j) * hidden + i];
  if (shared_y) s += moe_shared_term(shared_y[t * hidden + i]);
  if (add) s += bf16_bits_to_float(add[t * hidden + i]);
  return s;
}

__global__ void combine_kernel(const float* __restrict__ y, int64_t n, int64_t top_k, int64_t hidden,
                               const float* __restrict__ shared_y, const uint16_t* __restrict__ add,
                               uint16_t* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * hidden) return;
  out[idx] = float_to_bf16_bits(combined(y, idx / hidden, top_k, hidden, idx % hidden, shared_y, add));
}

// One block per token through the SDK's combine + norm row (kiln/cuda/moe_combine_norm_row.cuh, which
// transport-nccl's fused all-reduce shares), so the residual sum, the sum of squares and the normed row are bit for
// bit what combine + add_rmsnorm_bf16 give.
constexpr int kNormThreads = 256;

template <int kPer, int kMinBlocks = 0>  // kMinBlocks 0: no occupancy bound (launch bounds of the threads alone)
__global__ void __launch_bounds__(kNormThreads, kMinBlocks) combine_add_rmsnorm_kernel(
    const float* __restrict__ y, int64_t top_k, int64_t hidden, const float* __restrict__ shared_y,
    const uint16_t* __restrict__ add, float* __restrict__ residual, const uint16_t* __restrict__ weight, float eps,
    uint16_t* __restrict__ normed) {
  const int64_t row = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  // combined()'s sums in its order (experts, then the shared expert, then `add`).
  moe_combine_add_rmsnorm_row<kNormThreads, kPer>(
      [&](int64_t k, int64_t i) { return y[(row * top_k + k) * hidden + i]; }, top_k,
      [&](float s, int64_t i) {
        if (shared_y) s += moe_shared_term(shared_y[row * hidden + i]);
        if (add) s += bf16_bits_to_float(add[row * hidden + i]);
        return s;
      },
      hidden, residual + row * hidden, weight, eps, normed + row * hidden);
}

auto combine_add_rmsnorm_kernel_for(int64_t hidden) {
  switch (rmsnorm_row_values(hidden, kNormThreads)) {
    case 4: return combine_add_rmsnorm_kernel<4>;
    // Four blocks an SM (≤ 64 registers, no spills): a 4K prompt's combine of GLM-4.7-Flash (hidden 2048) took
    // 130 µs at the 70 registers left to the compiler (three blocks an SM, each a load → reduce → store chain with
    // the SM's memory pipe idle in between) and takes 85 µs — its bytes at the copy rate — on an H100; five or six
    // blocks spill and are slower (104 / 135 µs). Register use only: the same instructions, the same bits.
    case 8: return combine_add_rmsnorm_kernel<8, 4>;
    case 16: return combine_add_rmsnorm_kernel<16>;
    case 32: return combine_add_rmsnorm_kernel<32>;
    default: return combine_add_rmsnorm_kernel<0>;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool fits_int(int64_t v) { return v > 0 && v <= INT32_MAX; }

}  // namespace

Status moe_group_by_expert(const int32_t* ids, int64_t pairs, int64_t num_experts, const MoeDispatch& d,
                           StreamHandle stream) {
  if (num_experts <= 0 || num_experts > kMaxExperts)
    return invalid_argument("cuda::moe_group_by_expert: num_experts must be in [1, 1024]");
  if (pairs < 0) return invalid_argument("cuda::moe_group_by_expert: pairs < 0");
  const int slices = group_slices(static_cast<int>(num_experts));
  return check_cuda(launch_pdl(group_kernel, dim3(1), dim3(kMaxExperts), sizeof(int) * slices * num_experts, stream,
                               ids, pairs, static_cast<int>(num_experts), slices, d),
                    "cuda::moe_group_by_expert");
}

Status moe_gate_up_swiglu_bf16(const uint16_t* x, int64_t n, int64_t top_k, int64_t hidden, int64_t inter,
                               const uint16_t* gate_up, int64_t num_experts, const MoeDispatch& d, float limit,
                               uint16_t* h, StreamHandle stream, const MoeSharedExpert* shared) {
  if (hidden % 8 != 0 || !fits_int(hidden) || !fits_int(2 * inter) || top_k <= 0 || !aligned16(x) ||
      !aligned16(gate_up))
    return invalid_argument(
        "cuda::moe_gate_up_swiglu_bf16: hidden must be a multiple of 8, inter > 0 and x / weights 16-byte aligned");
  if (shared && (shared->n != n || !shared->gate_up || !shared->h || !aligned16(shared->gate_up)))
    return invalid_argument(
        "cuda::moe_gate_up_swiglu_bf16: the shared expert needs n rows, gate_up (16-byte aligned) and h");
  if (n <= 0) return ok_status();
  if (!fits_int(n * top_k)) return invalid_argument("cuda::moe_gate_up_swiglu_bf16: too many pairs");
  const TileArgs a{.x = x,
                   .top_k = static_cast<int>(top_k),
                   .in_dim = static_cast<int>(hidden),
                   .out_dim = static_cast<int>(inter),
                   .w = gate_up,
                   .d = d,
                   .route_weight = nullptr,
                   .limit = limit,
                   .out = h,
                   .shared_w = shared ? shared->gate_up : nullptr,
                   .shared_x = x,
                   .shared_out = shared ? shared->h : nullptr,
                   .shared_rows = static_cast<int>(n)};
  return launch_tiles<true>(a, n * top_k, num_experts, stream, "cuda::moe_gate_up_swiglu_bf16");
}

Status moe_down_bf16(const uint16_t* h, int64_t pairs, int64_t inter, int64_t hidden, const uint16_t* down,
                     int64_t num_experts, const MoeDispatch& d, const float* route_weight, float* y,
                     StreamHandle stream, const MoeSharedExpert* shared) {
  if (inter % 8 != 0 || !fits_int(inter) || !fits_int(hidden) || !aligned16(h) || !aligned16(down))
    return invalid_argument("cuda::moe_down_bf16: inter must be a multiple of 8 and h / weights 16-byte aligned");
  if (shared && (!fits_int(shared->n) || !shared->down || !shared->h || !shared->y || !aligned16(shared->down) ||
                 !aligned16(shared->h)))
    return invalid_argument(
        "cuda::moe_down_bf16: the shared expert needs n > 0 rows, down and h (16-byte aligned) and y");
  if (pairs <= 0) return ok_status();
  if (!fits_int(pairs)) return invalid_argument("cuda::moe_down_bf16: too many pairs");
  const TileArgs a{.x = h,
                   .top_k = 1,
                   .in_dim = static_cast<int>(inter),
                   .out_dim = static_cast<int>(hidden),
                   .w = down,
                   .d = d,
                   .route_weight = route_weight,
                   .limit = 0.f,
                   .out = y,
                   .shared_w = shared ? shared->down : nullptr,
                   .shared_x = shared ? shared->h : nullptr,
                   .shared_out = shared ? shared->y : nullptr,
                   .shared_rows = shared ? static_cast<int>(shared->n) : 0};
  return launch_tiles<false>(a, pairs, num_experts, stream, "cuda::moe_down_bf16");
}

Status moe_combine_bf16(const float* y, int64_t n, int64_t top_k, int64_t hidden, const uint16_t* add, uint16_t* out,
                        StreamHandle stream, const float* shared_y) {
  if (n < 0 || top_k <= 0 || hidden <= 0) return invalid_argument("cuda::moe_combine_bf16: bad shape");
  if (n == 0) return ok_status();
  constexpr int kThreads = 256;
  return check_cuda(launch_pdl(combine_kernel, dim3(blocks_for(n * hidden, kThreads)), dim3(kThreads), 0, stream, y,
                               n, top_k, hidden, shared_y, add, out),
                    "cuda::moe_combine_bf16");
}

Status moe_combine_add_rmsnorm_bf16(const float* y, int64_t n, int64_t top_k, int64_t hidden, const uint16_t* add,
                                    const float* shared_y, float* residual, const uint16_t* norm_weight, float eps,
                                    uint16_t* normed, StreamHandle stream) {
  if (n < 0 || top_k <= 0 || hidden <= 0) return invalid_argument("cuda::moe_combine_add_rmsnorm_bf16: bad shape");
  if (n == 0) return ok_status();
  return check_cuda(launch_pdl(combine_add_rmsnorm_kernel_for(hidden), dim3(static_cast<unsigned>(n)), dim3(kNormThreads), 0,
                               stream, y, top_k, hidden, shared_y, add, residual, norm_weight, eps, normed),
                    "cuda::moe_combine_add_rmsnorm_bf16");
}

}  // namespace kiln::cuda
