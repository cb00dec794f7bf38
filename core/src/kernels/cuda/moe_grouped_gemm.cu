#include "kernels/cuda/moe_grouped_gemm.h"

#include <algorithm>

#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/moe_grouped_gemm_sm90.h"
#include "kernels/cuda/moe_grouped_tiles.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBlockN = 128;         // weight rows per CTA; gate_up: 64 gate rows and the matching 64 up rows
constexpr int kBlockK = 32;
constexpr int kStages = 4;           // cp.async pipeline depth
constexpr int kThreads = 256;        // 8 warps: 4 along M × 2 along N, each 16·kMi rows × 64 weight rows
constexpr int kPitch = kBlockK + 8;  // 80-byte smem rows: the 8 rows one ldmatrix reads fall in distinct bank groups
constexpr int kChunksPerRow = kBlockK / 8;
constexpr int kRowsPerPass = kThreads / kChunksPerRow;
constexpr int kLoadsB = kBlockN / kRowsPerPass;
static_assert(kLoadsB == 2 && kRowsPerPass == kBlockN / 2, "gate_up tiles load gate rows in pass 0, up rows in pass 1");

// kMi m16 tiles per warp: 128-row blocks (kMi = 2) when experts have hundreds of rows; 64-row blocks (kMi = 1)
// halve the padding rows when they have tens (short prefills), where the weights' bytes bound the time anyway.
template <int kMi>
struct Shape {
  static constexpr int kBlockM = 4 * 16 * kMi;  // grouped rows (pairs of one expert) per CTA
  static constexpr int kLoadsA = kBlockM / kRowsPerPass;
  static constexpr int kStageElems = (kBlockM + kBlockN) * kPitch;
  static constexpr size_t kSmemBytes = sizeof(uint16_t) * kStages * kStageElems;  // ≤ 80 KiB: two CTAs per SM
};

// grid: (output column blocks, row-block upper bound). C = A_e · W_eᵀ for the CTA's kBlockM rows of expert e.
// kGateUp: A rows gathered from x through pair_order (the token permutation), W = gate_up_e, epilogue SwiGLU →
// bf16 h in grouped order, n_dim = inter. Else: A = h in grouped order, W = down_e, epilogue route weight →
// fp32 y in pair order, n_dim = hidden.
template <bool kGateUp, int kMi>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_gemm_kernel(const uint16_t* __restrict__ a, int64_t top_k, int64_t k_dim, const uint16_t* __restrict__ w,
                        int64_t n_dim, MoeDispatch d, int experts, const float* __restrict__ route_weight, float limit,
                        void* __restrict__ out) {
  using S = Shape<kMi>;
  constexpr int kBlockM = S::kBlockM, kLoadsA = S::kLoadsA, kStageElems = S::kStageElems;
  const GroupedTile tile = find_grouped_tile<kBlockM>(d.expert_offsets, experts, static_cast<int>(blockIdx.y));
  if (tile.expert < 0) return;
  const int begin = d.expert_offsets[tile.expert] + tile.m0;
  const int rows = min(kBlockM, d.expert_offsets[tile.expert + 1] - begin);
  const int64_t w_rows = kGateUp ? 2 * n_dim : n_dim;
  const uint16_t* we = w + static_cast<int64_t>(tile.expert) * w_rows * k_dim;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * (kGateUp ? kBlockN / 2 : kBlockN);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int chunk = tid % kChunksPerRow, load_row = tid / kChunksPerRow;

  // Each thread copies the same rows (at the same 16-byte column) of every k-tile: resolve their sources once.
  const uint16_t* a_src[kLoadsA];
  bool a_ok[kLoadsA];
#pragma unroll
  for (int i = 0; i < kLoadsA; ++i) {
    const int r = load_row + i * kRowsPerPass;
    a_ok[i] = r < rows;
    int64_t row = 0;
    if (a_ok[i]) row = kGateUp ? d.pair_order[begin + r] / top_k : begin + r;
    a_src[i] = a + row * k_dim + chunk * 8;
  }
  const uint16_t* b_src[kLoadsB];
  bool b_ok[kLoadsB];
#pragma unroll
  for (int i = 0; i < kLoadsB; ++i) {
    const int r = load_row + i * kRowsPerPass;
    const int64_t col = n0 + (kGateUp ? r % (kBlockN / 2) : r);
    b_ok[i] = col < n_dim;
    const int64_t wrow = kGateUp && i == 1 ? n_dim + col : col;
    b_src[i] = we + (b_ok[i] ? wrow : 0) * k_dim + chunk * 8;
  }

  const int k_tiles = static_cast<int>((k_dim + kBlockK - 1) / kBlockK);
  auto load = [&](int kt) {
    if (kt < k_tiles) {
      uint16_t* sa = smem + (kt % kStages) * kStageElems;
      uint16_t* sb = sa + kBlockM * kPitch;
      const int64_t k = static_cast<int64_t>(kt) * kBlockK;
      const bool k_ok = k + chunk * 8 < k_dim;
#pragma unroll
      for (int i = 0; i < kLoadsA; ++i)
        cp_async_16(sa + (load_row + i * kRowsPerPass) * kPitch + chunk * 8, a_src[i] + (k_ok ? k : 0),
                    a_ok[i] && k_ok);
#pragma unroll
      for (int i = 0; i < kLoadsB; ++i)
        cp_async_16(sb + (load_row + i * kRowsPerPass) * kPitch + chunk * 8, b_src[i] + (k_ok ? k : 0),
                    b_ok[i] && k_ok);
    }
    cp_async_commit();  // empty groups past the end keep the wait count uniform
  };

  const int wm = warp % 4, wn = warp / 4;
  const int a_off = (wm * 16 * kMi + lane % 16) * kPitch + (lane / 16) * 8;
  const int b_lane = ((lane / 16) * 8 + lane % 8) * kPitch + ((lane / 8) % 2) * 8;
  // The warp's 64 weight rows in 16-row pairs of n-tiles; gate_up: two of gate, then the two matching up rows, so
  // acc[.][j] (gate) and acc[.][j + 4] (up) hold the same h columns.
  int b_off[4];
#pragma unroll
  for (int np = 0; np < 4; ++np)
    b_off[np] = (kGateUp ? (np < 2 ? 32 * wn + 16 * np : kBlockN / 2 + 32 * wn + 16 * (np - 2)) : 64 * wn + 16 * np) *
                    kPitch + b_lane;

  float acc[kMi][8][4];
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // k-tile kt landed; every warp is done with the stage the next load overwrites
    load(kt + kStages - 1);
    const uint16_t* sa = smem + (kt % kStages) * kStageElems;
    const uint16_t* sb = sa + kBlockM * kPitch;
#pragma unroll
    for (int ks = 0; ks < kBlockK / 16; ++ks) {
      uint32_t af[kMi][4];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) ldmatrix_x4(af[mi], sa + a_off + mi * 16 * kPitch + ks * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, sb + b_off[np] + ks * 16);
#pragma unroll
        for (int mi = 0; mi < kMi; ++mi) {
          mma_bf16_16816(acc[mi][2 * np], af[mi], b[0], b[1]);
          mma_bf16_16816(acc[mi][2 * np + 1], af[mi], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * 16 * kMi + mi * 16 + g + 8 * half;
      if (r >= rows) continue;
      const int s = begin + r;
      if constexpr (kGateUp) {
        uint16_t* dst = static_cast<uint16_t*>(out) + static_cast<int64_t>(s) * n_dim;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t col = n0 + 32 * wn + 8 * j + 2 * c;
          if (col >= n_dim) continue;  // n_dim % 8 == 0: col + 1 is in range with col
          *reinterpret_cast<uint32_t*>(dst + col) =
              pack_bf16x2(grouped_swiglu(acc[mi][j][2 * half], acc[mi][j + 4][2 * half], limit),
                          grouped_swiglu(acc[mi][j][2 * half + 1], acc[mi][j + 4][2 * half + 1], limit));
        }
      } else {
        const int p = d.pair_order[s];
        const float scale = route_weight ? route_weight[p] : 1.0f;
        float* dst = static_cast<float*>(out) + static_cast<int64_t>(p) * n_dim;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int64_t col = n0 + 64 * wn + 8 * j + 2 * c;
          if (col >= n_dim) continue;
          *reinterpret_cast<float2*>(dst + col) =
              make_float2(acc[mi][j][2 * half] * scale, acc[mi][j][2 * half + 1] * scale);
        }
      }
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <bool kGateUp, int kMi>
Status launch_shape(const char* name, const uint16_t* a, int64_t pairs, int64_t top_k, int64_t k_dim,
                    const uint16_t* w, int64_t n_dim, int64_t num_experts, const MoeDispatch& d,
                    const float* route_weight, float limit, void* out, StreamHandle stream) {
  using S = Shape<kMi>;
  // Per call, not once: the attribute is per device.
  KILN_RETURN_IF_ERROR(check_cuda(cudaFuncSetAttribute(grouped_gemm_kernel<kGateUp, kMi>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(S::kSmemBytes)),
                                  name));
  const int64_t block_n = kGateUp ? kBlockN / 2 : kBlockN;
  const int64_t col_blocks = (n_dim + block_n - 1) / block_n;
  const int64_t row_blocks = grouped_row_block_bound(pairs, num_experts, S::kBlockM);
  if (row_blocks > 65535 || col_blocks > 65535)
    return invalid_argument(std::string(name) + ": too many pairs or columns for one launch");
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks));
  grouped_gemm_kernel<kGateUp, kMi><<<grid, kThreads, S::kSmemBytes, stream>>>(
      a, top_k, k_dim, w, n_dim, d, static_cast<int>(num_experts), route_weight, limit, out);
  return check_launch(name);
}

// The row block from the mean rows per expert (the host does not see the routing): 64 rows while that mean is ≤ 64.
template <bool kGateUp>
Status launch(const char* name, const uint16_t* a, int64_t pairs, int64_t top_k, int64_t k_dim, const uint16_t* w,
              int64_t n_dim, int64_t num_experts, const MoeDispatch& d, const float* route_weight, float limit,
              void* out, StreamHandle stream) {
  if (pairs <= 64 * num_experts)
    return launch_shape<kGateUp, 1>(name, a, pairs, top_k, k_dim, w, n_dim, num_experts, d, route_weight, limit, out,
                                    stream);
  return launch_shape<kGateUp, 2>(name, a, pairs, top_k, k_dim, w, n_dim, num_experts, d, route_weight, limit, out,
                                  stream);
}

}  // namespace

Status moe_gate_up_swiglu_grouped_bf16(const uint16_t* x, int64_t n, int64_t top_k, int64_t hidden, int64_t inter,
                                       const uint16_t* gate_up, int64_t num_experts, const MoeDispatch& dispatch,
                                       float limit, uint16_t* h_grouped, StreamHandle stream) {
  constexpr const char* kName = "cuda::moe_gate_up_swiglu_grouped_bf16";
  if (hidden <= 0 || hidden % 8 != 0 || inter <= 0 || inter % 8 != 0 || top_k <= 0 || n < 0)
    return invalid_argument(std::string(kName) + ": hidden and inter must be positive multiples of 8, top_k ≥ 1");
  if (num_experts <= 0 || num_experts > 1024)
    return invalid_argument(std::string(kName) + ": num_experts must be in [1, 1024]");
  if (!aligned16(x) || !aligned16(gate_up) || !aligned16(h_grouped))
    return invalid_argument(std::string(kName) + ": x, gate_up and h_grouped must be 16-byte aligned");
  if (n == 0) return ok_status();
  if (moe_grouped_sm90_applies())
    return moe_grouped_gemm_sm90(true, x, n * top_k, top_k, hidden, gate_up, inter, num_experts, dispatch, nullptr,
                                 limit, h_grouped, stream);
  return launch<true>(kName, x, n * top_k, top_k, hidden, gate_up, inter, num_experts, dispatch, nullptr, limit,
                      h_grouped, stream);
}

Status moe_down_grouped_bf16(const uint16_t* h_grouped, int64_t pairs, int64_t inter, int64_t hidden,
                             const uint16_t* down, int64_t num_experts, const MoeDispatch& dispatch,
                             const float* route_weight, float* y, StreamHandle stream) {
  constexpr const char* kName = "cuda::moe_down_grouped_bf16";
  if (hidden <= 0 || hidden % 8 != 0 || inter <= 0 || inter % 8 != 0 || pairs < 0)
    return invalid_argument(std::string(kName) + ": hidden and inter must be positive multiples of 8");
  if (num_experts <= 0 || num_experts > 1024)
    return invalid_argument(std::string(kName) + ": num_experts must be in [1, 1024]");
  if (!aligned16(h_grouped) || !aligned16(down) || reinterpret_cast<uintptr_t>(y) % 8 != 0)
    return invalid_argument(std::string(kName) + ": h_grouped and down must be 16-byte aligned, y 8-byte aligned");
  if (pairs == 0) return ok_status();
  if (moe_grouped_sm90_applies())
    return moe_grouped_gemm_sm90(false, h_grouped, pairs, 1, inter, down, hidden, num_experts, dispatch, route_weight,
                                 0.f, y, stream);
  return launch<false>(kName, h_grouped, pairs, 1, inter, down, hidden, num_experts, dispatch, route_weight, 0.f, y,
                       stream);
}

}  // namespace kiln::cuda
