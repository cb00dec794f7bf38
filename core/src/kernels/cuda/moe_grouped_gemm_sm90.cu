#include "kernels/cuda/moe_grouped_gemm_sm90.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/moe_grouped_tiles.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kiln/cuda/mbarrier.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBlockM = 128;   // rows (pairs of one expert) per CTA: 64 per consumer warpgroup
constexpr int kBlockN = 256;   // weight rows per CTA, two TMA boxes of 128
constexpr int kBoxRows = 128;
constexpr int kBlockK = 64;    // one 128-byte swizzle row of bf16
constexpr int kStages = 4;
constexpr int kThreads = 384;  // warpgroup 0 loads, warpgroups 1 and 2 multiply
constexpr int kProducerRegs = 56, kConsumerRegs = 224;  // 128·56 + 256·224 = 64,512 ≤ 64K registers
constexpr int kRowsPerPass = 128 / (kBlockK / 8);       // producer threads per 16-byte column, rows a pass
constexpr int kLoadsA = kBlockM / kRowsPerPass;         // rows each producer thread copies per k tile

constexpr uint32_t kATile = kBlockM * kBlockK * 2;  // 16 KB
constexpr uint32_t kBTile = kBlockN * kBlockK * 2;  // 32 KB
constexpr uint32_t kStage = kATile + kBTile;
constexpr uint32_t kBarriers = kStages * kStage;            // full[kStages], empty[kStages]
constexpr size_t kAlloc = kBarriers + 16 * kStages + 1024;  // the dynamic window is only 16-byte aligned
static_assert(kATile % 1024 == 0 && kBTile % 1024 == 0, "swizzled tiles must stay 1024-byte aligned");
static_assert(kLoadsA == 8, "8 producer rows per k tile and thread");

struct GroupedSm90Args {
  const uint16_t* a;
  int top_k, k_dim, n_dim, experts;
  MoeDispatch d;
  const float* route_weight;
  float limit;
  void* out;
  bool tail_split;
};

// grid: (output column blocks, row-block upper bound). kGateUp: the CTA's 128 h columns n0 .. n0 + 127 take gate
// rows n0.. and up rows n_dim + n0.. of expert e (rows past n_dim read other rows or zeros and are never stored);
// else its 256 output columns take down rows n0 .. n0 + 255.
//
// The ring: full[s] completes when the 128 producer threads have arrived (each after its own cp.async copies of the
// stage landed and a proxy fence made them visible to the tensor cores) and thread 0's expect_tx arrival's TMA bytes
// have landed; empty[s] when the consumers' 8 warps have arrived, each after the products that read the stage.
// A producer thread signals stage t once it has issued stage t + kLag, so kLag stages of its copies stay in flight
// behind the one it waits for. Issuing t + kLag waits for the consumers to release stage t + kLag − kStages, which
// they do only after their products of the stage after it, t + kLag − kStages + 1 — so that stage must already be
// signalled: kLag ≤ kStages − 2 (kLag = 3 of 4 deadlocks: measured as a hang on an H100).
template <bool kGateUp, int kLag>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_sm90_kernel(const GroupedSm90Args p, const __grid_constant__ CUtensorMap w_map) {
  static_assert(kLag >= 1 && kLag <= kStages - 2, "a stage is released only after the next one's products");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const GroupedTile tile = find_grouped_tile<kBlockM>(p.d.expert_offsets, p.experts, static_cast<int>(blockIdx.y));
  if (tile.expert < 0) return;
  const int begin = p.d.expert_offsets[tile.expert] + tile.m0;
  const int rows = min(kBlockM, p.d.expert_offsets[tile.expert + 1] - begin);
  const int n0 = static_cast<int>(blockIdx.x) * (kGateUp ? kBoxRows : kBlockN);
  const int k_tiles = (p.k_dim + kBlockK - 1) / kBlockK;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw_addr);
  auto a_tile = [&](int s) { return static_cast<uint32_t>(s) * kStage; };
  auto b_tile = [&](int s) { return static_cast<uint32_t>(s) * kStage + kATile; };
  auto full = [&](int s) { return base + kBarriers + 8 * s; };
  auto empty = [&](int s) { return base + kBarriers + 8 * (kStages + s); };

  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full(s), 128 + 1);
      mbarrier_init(empty(s), 8);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  if (tid < 128) {
    warpgroup_reg_dealloc<kProducerRegs>();
    // This thread's 16-byte column of the k tile and its 8 rows (tid / 8 + 16·i): their source rows once.
    const int chunk = tid % 8;
    int src[kLoadsA];
    uint32_t valid = 0;
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int r = tid / 8 + kRowsPerPass * i;
      src[i] = 0;
      if (r < rows) {
        valid |= 1u << i;
        src[i] = kGateUp ? p.d.pair_order[begin + r] / p.top_k : begin + r;
      }
    }
    const int w_rows = kGateUp ? 2 * p.n_dim : p.n_dim;
    const int wrow0 = tile.expert * w_rows + n0;
    const int wrow1 = kGateUp ? wrow0 + p.n_dim : wrow0 + kBoxRows;
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % kStages;
      mbarrier_wait(empty(s), ((kt / kStages) & 1) ^ 1);
      if (tid == 0) {
        mbarrier_arrive_expect_tx(full(s), kBTile);
        tma_load_2d(base + b_tile(s), &w_map, kt * kBlockK, wrow0, full(s));
        tma_load_2d(base + b_tile(s) + kBTile / 2, &w_map, kt * kBlockK, wrow1, full(s));
      }
      const int k = kt * kBlockK + chunk * 8;
      const bool k_ok = k < p.k_dim;
#pragma unroll
      for (int i = 0; i < kLoadsA; ++i) {
        const int r = tid / 8 + kRowsPerPass * i;
        cp_async_16(smem + a_tile(s) + smem_swizzle_128b_offset(r, chunk, kBlockM),
                    p.a + static_cast<int64_t>(src[i]) * p.k_dim + (k_ok ? k : 0), ((valid >> i) & 1u) && k_ok);
      }
      cp_async_commit();
      if (kt >= kLag) {
        cp_async_wait<kLag>();
        fence_proxy_async_shared();
        mbarrier_arrive(full((kt - kLag) % kStages));
      }
    }
    cp_async_wait<0>();
    fence_proxy_async_shared();
    for (int kt = max(k_tiles - kLag, 0); kt < k_tiles; ++kt) mbarrier_arrive(full(kt % kStages));
    return;
  }

  warpgroup_reg_alloc<kConsumerRegs>();
  const int cw = tid / 128 - 1, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  if (rows <= 64 && p.tail_split) {
    // An expert's last rows (≤ 64, or a small expert's all): both warpgroups take A's rows 0..63 and split the
    // weight rows instead, two m64n64 products each — gate_up: gate rows 64·cw.. and the matching up rows 128 + 64·cw..
    // (h columns 64·cw ..); down: weight rows 128·cw .. 128·cw + 127 — so such a tile takes half the time it would
    // on one warpgroup.
    const uint32_t r0 = kGateUp ? 64 * cw : 128 * cw, r1 = kGateUp ? 128 + 64 * cw : 128 * cw + 64;
    float t0[32], t1[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) t0[i] = 0.f, t1[i] = 0.f;
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % kStages;
      mbarrier_wait(full(s), (kt / kStages) & 1);
      wgmma_fence();
      const uint32_t a_addr = base + a_tile(s), b_addr = base + b_tile(s);
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        const uint64_t da = wgmma_desc_128b(a_addr + kk * 32, 16, 1024);
        wgmma_m64n64k16_ss(t0, da, wgmma_desc_128b(b_addr + r0 * 128 + kk * 32, 16, 1024), 1);
        wgmma_m64n64k16_ss(t1, da, wgmma_desc_128b(b_addr + r1 * 128 + kk * 32, 16, 1024), 1);
      }
      wgmma_commit();
      wgmma_wait<1>();
      if (kt > 0) {
        __syncwarp();
        if (lane == 0) mbarrier_arrive(empty((kt - 1) % kStages));
      }
    }
    wgmma_wait<0>();
    wgmma_pin(t0);
    wgmma_pin(t1);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = 16 * warp + g + 8 * half;
      if (r >= rows) continue;
      const int srow = begin + r;
      if constexpr (kGateUp) {
        uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(srow) * p.n_dim;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = n0 + 64 * cw + 8 * j + 2 * c;
          if (col >= p.n_dim) continue;
          *reinterpret_cast<uint32_t*>(dst + col) =
              pack_bf16x2(grouped_swiglu(t0[4 * j + 2 * half], t1[4 * j + 2 * half], p.limit),
                          grouped_swiglu(t0[4 * j + 2 * half + 1], t1[4 * j + 2 * half + 1], p.limit));
        }
      } else {
        const int pair = p.d.pair_order[srow];
        const float scale = p.route_weight ? p.route_weight[pair] : 1.0f;
        float* dst = static_cast<float*>(p.out) + static_cast<int64_t>(pair) * p.n_dim;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const float* t = u ? t1 : t0;
            const int col = n0 + 128 * cw + 64 * u + 8 * j + 2 * c;
            if (col >= p.n_dim) continue;
            *reinterpret_cast<float2*>(dst + col) = make_float2(t[4 * j + 2 * half] * scale, t[4 * j + 2 * half + 1] * scale);
          }
      }
    }
    return;
  }
  const bool active = 64 * cw < rows;  // a warpgroup with no rows only hands the slots back
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  if (!active) {
    for (int kt = 0; kt + 1 < k_tiles; ++kt) {
      mbarrier_wait(full(kt % kStages), (kt / kStages) & 1);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(empty(kt % kStages));
    }
    return;
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStages;
    mbarrier_wait(full(s), (kt / kStages) & 1);
    wgmma_k_tile_m64n256(acc, base + a_tile(s) + cw * 64 * 128, base + b_tile(s));
    wgmma_wait<1>();  // the previous k tile's products are done: its slot can be refilled
    if (kt > 0) {
      __syncwarp();
      if (lane == 0) mbarrier_arrive(empty((kt - 1) % kStages));
    }
  }
  wgmma_wait<0>();
  wgmma_pin(acc);

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = 64 * cw + 16 * warp + g + 8 * half;
    if (r >= rows) continue;
    const int srow = begin + r;
    if constexpr (kGateUp) {
      uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(srow) * p.n_dim;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = n0 + 8 * j + 2 * c;
        if (col >= p.n_dim) continue;  // n_dim % 8 == 0: col + 1 is in range with col
        *reinterpret_cast<uint32_t*>(dst + col) =
            pack_bf16x2(grouped_swiglu(acc[4 * j + 2 * half], acc[4 * (j + 16) + 2 * half], p.limit),
                        grouped_swiglu(acc[4 * j + 2 * half + 1], acc[4 * (j + 16) + 2 * half + 1], p.limit));
      }
    } else {
      const int pair = p.d.pair_order[srow];
      const float scale = p.route_weight ? p.route_weight[pair] : 1.0f;
      float* dst = static_cast<float*>(p.out) + static_cast<int64_t>(pair) * p.n_dim;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = n0 + 8 * j + 2 * c;
        if (col >= p.n_dim) continue;
        *reinterpret_cast<float2*>(dst + col) =
            make_float2(acc[4 * j + 2 * half] * scale, acc[4 * j + 2 * half + 1] * scale);
      }
    }
  }
#else
  __trap();  // sm_90a only; moe_grouped_sm90_applies keeps other devices off this kernel
#endif
}

template <bool kGateUp, int kLag>
Status launch(const char* name, const GroupedSm90Args& args, int64_t pairs, int64_t num_experts, const uint16_t* w,
              StreamHandle stream) {
  const int64_t w_rows = (kGateUp ? 2 : 1) * static_cast<int64_t>(args.n_dim) * num_experts;
  CUtensorMap map;
  const uint64_t dims[2] = {static_cast<uint64_t>(args.k_dim), static_cast<uint64_t>(w_rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(args.k_dim)};
  const uint32_t box[2] = {kBlockK, kBoxRows};
  KILN_RETURN_IF_ERROR(make_bf16_tensor_map_128b(&map, w, 2, dims, strides, box, name));
  // Per call, not once: the attribute is per device.
  KILN_RETURN_IF_ERROR(check_cuda(cudaFuncSetAttribute(grouped_gemm_sm90_kernel<kGateUp, kLag>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(kAlloc)),
                                  name));
  const int64_t block_n = kGateUp ? kBoxRows : kBlockN;
  const int64_t col_blocks = (args.n_dim + block_n - 1) / block_n;
  const int64_t row_blocks = grouped_row_block_bound(pairs, num_experts, kBlockM);
  if (row_blocks > 65535 || col_blocks > 65535)
    return invalid_argument(std::string(name) + ": too many pairs or columns for one launch");
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks));
  grouped_gemm_sm90_kernel<kGateUp, kLag><<<grid, kThreads, kAlloc, stream>>>(args, map);
  return check_launch(name);
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

template <bool kGateUp>
Status launch_lag(const char* name, const GroupedSm90Args& args, int64_t pairs, int64_t num_experts,
                  const uint16_t* w, StreamHandle stream) {
  // moe_grouped_gemm_sm90.h: the producer's signalling lag, 2 unless the environment asks for 1.
  if (env_int("KILN_MOE_SM90_LAG", 2) == 1) return launch<kGateUp, 1>(name, args, pairs, num_experts, w, stream);
  return launch<kGateUp, 2>(name, args, pairs, num_experts, w, stream);
}

}  // namespace

bool moe_grouped_sm90_applies() {
  const char* env = std::getenv("KILN_MOE_GROUPED_SM90");
  if (env && std::strcmp(env, "0") == 0) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

Status moe_grouped_gemm_sm90(bool gate_up, const uint16_t* a, int64_t pairs, int64_t top_k, int64_t k_dim,
                             const uint16_t* w, int64_t n_dim, int64_t num_experts, const MoeDispatch& d,
                             const float* route_weight, float limit, void* out, StreamHandle stream) {
  const char* name = gate_up ? "cuda::moe_gate_up_swiglu_grouped_bf16 (sm90)" : "cuda::moe_down_grouped_bf16 (sm90)";
  if (k_dim > (1 << 30) || n_dim > (1 << 29) || num_experts * n_dim * 2 > (int64_t{1} << 31))
    return invalid_argument(std::string(name) + ": shapes past 32-bit row and column indices");
  const GroupedSm90Args args{a, static_cast<int>(top_k), static_cast<int>(k_dim), static_cast<int>(n_dim),
                             static_cast<int>(num_experts), d, route_weight, limit, out,
                             env_int("KILN_MOE_SM90_TAIL", 1) != 0};
  return gate_up ? launch_lag<true>(name, args, pairs, num_experts, w, stream)
                 : launch_lag<false>(name, args, pairs, num_experts, w, stream);
}

}  // namespace kiln::cuda
