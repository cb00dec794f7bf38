#include "kernels/cuda/mla_kv_expand_sm90.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kiln/cuda/mbarrier.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBlockM = 128;   // keys per CTA: 64 per consumer warpgroup
constexpr int kBlockN = 256;   // kv_b rows per CTA, two TMA boxes of 128
constexpr int kBoxRows = 128;
constexpr int kBlockK = 64;    // one 128-byte swizzle row of bf16
constexpr int kStages = 4;
constexpr int kThreads = 384;  // warpgroup 0 loads (one thread), warpgroups 1 and 2 multiply
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128·40 + 256·232 = 64,512 ≤ 64K registers

constexpr uint32_t kATile = kBlockM * kBlockK * 2;  // 16 KB
constexpr uint32_t kBTile = kBlockN * kBlockK * 2;  // 32 KB
constexpr uint32_t kStage = kATile + kBTile;
constexpr uint32_t kBarriers = kStages * kStage;            // full[kStages], empty[kStages]
constexpr size_t kAlloc = kBarriers + 16 * kStages + 1024;  // the dynamic window is only 16-byte aligned
static_assert(kATile % 1024 == 0 && kBTile % 1024 == 0, "swizzled tiles must stay 1024-byte aligned");

struct ExpandArgs {
  int keys, k_dim, n_dim, head_width;
  int col_blocks, tiles;  // tiles = key blocks × col_blocks, column block fastest
  uint16_t* out;
};

// Persistent: one CTA per SM walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... (128 keys × 256 kv_b rows each;
// column block fastest, so the CTAs working at once share their keys' rows and sweep kv_b, which stays in L2). The
// k loop of a tile is only latent / 64 = 8 stages long, so a CTA per tile spent most of its time filling the ring
// and storing (measured: 16.6 µs a tile for 5.7 µs of products at the tensor rate); here the producer runs on into
// the next tile's stages while the consumers store the last one's values.
//
// The ring: full[s] completes on the producer's expect_tx arrival once the stage's TMA bytes have landed (a box
// partly outside the tensor still delivers all its bytes, as zeros); empty[s] when the consumers' 8 warps have
// arrived, each after the products that read the stage. Stage uses are counted across tiles (u = the CTA's running
// k-tile count): slot u % kStages, phase (u / kStages) & 1.
__global__ void __launch_bounds__(kThreads, 1)
    mla_kv_expand_sm90_kernel(const ExpandArgs p, const __grid_constant__ CUtensorMap a_map,
                              const __grid_constant__ CUtensorMap w_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int k_tiles = (p.k_dim + kBlockK - 1) / kBlockK;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  auto a_tile = [&](int s) { return base + static_cast<uint32_t>(s) * kStage; };
  auto b_tile = [&](int s) { return base + static_cast<uint32_t>(s) * kStage + kATile; };
  auto full = [&](int s) { return base + kBarriers + 8 * s; };
  auto empty = [&](int s) { return base + kBarriers + 8 * (kStages + s); };

  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full(s), 1);
      mbarrier_init(empty(s), 8);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  if (tid < 128) {
    warpgroup_reg_dealloc<kProducerRegs>();
    if (tid != 0) return;
    int u = 0;
    for (int tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
      const int m0 = (tile / p.col_blocks) * kBlockM, n0 = (tile % p.col_blocks) * kBlockN;
      for (int kt = 0; kt < k_tiles; ++kt, ++u) {
        const int s = u % kStages;
        mbarrier_wait(empty(s), ((u / kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(full(s), kStage);
        tma_load_2d(a_tile(s), &a_map, kt * kBlockK, m0, full(s));
        tma_load_2d(b_tile(s), &w_map, kt * kBlockK, n0, full(s));
        tma_load_2d(b_tile(s) + kBTile / 2, &w_map, kt * kBlockK, n0 + kBoxRows, full(s));
      }
    }
    return;
  }

  warpgroup_reg_alloc<kConsumerRegs>();
  const int cw = tid / 128 - 1, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  int u = 0;
  for (int tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
    const int m0 = (tile / p.col_blocks) * kBlockM, n0 = (tile % p.col_blocks) * kBlockN;
    // A warpgroup whose 64 keys are all past the end multiplies zeros all the same (only in the last key block):
    // it must hand every stage back.
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < k_tiles; ++kt, ++u) {
      const int s = u % kStages;
      mbarrier_wait(full(s), (u / kStages) & 1);
      wgmma_k_tile_m64n256(acc, a_tile(s) + cw * 64 * 128, b_tile(s));
      wgmma_wait<1>();  // the previous k tile's products are done: its slot can be refilled
      if (kt > 0) {
        __syncwarp();
        if (lane == 0) mbarrier_arrive(empty((u - 1) % kStages));
      }
    }
    wgmma_wait<0>();
    wgmma_pin(acc);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty((u - 1) % kStages));  // the tile's last stage

    // Accumulator 4j + e: key g + 8·(e / 2) of the warp's 16, kv_b row 8j + 2c + (e % 2) of the tile's 256.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = m0 + 64 * cw + 16 * warp + g + 8 * half;
      if (m >= p.keys) continue;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int n = n0 + 8 * j + 2 * c;
        if (n >= p.n_dim) continue;  // n_dim = heads · head_width is even: n + 1 is in range with n
        const int h = n / p.head_width, col = n - h * p.head_width;
        uint16_t* dst = p.out + (static_cast<int64_t>(h) * p.keys + m) * p.head_width + col;
        *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
#else
  __trap();  // sm_90a only; mla_kv_expand_sm90_supported keeps other devices off this kernel
#endif
}

}  // namespace

bool mla_kv_expand_sm90_supported(int64_t latent_dim, int64_t row_width, int64_t head_width, const void* latent,
                                  const void* kv_b, const void* out) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (latent_dim <= 0 || latent_dim % 8 != 0 || row_width % 8 != 0 || row_width < latent_dim || head_width <= 0 ||
      head_width % 2 != 0 || !aligned(latent) || !aligned(kv_b) || !aligned(out))
    return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

bool mla_kv_expand_sm90_applies(int64_t latent_dim, int64_t row_width, int64_t head_width, const void* latent,
                                const void* kv_b, const void* out) {
  const char* env = std::getenv("KILN_MLA_KV_EXPAND");
  return env && std::strcmp(env, "sm90") == 0 &&
         mla_kv_expand_sm90_supported(latent_dim, row_width, head_width, latent, kv_b, out);
}

Status mla_kv_expand_sm90(const uint16_t* latent, int64_t keys, int64_t row_width, int64_t latent_dim,
                          const uint16_t* kv_b, int64_t heads, int64_t head_width, uint16_t* out, StreamHandle stream) {
  const char* name = "cuda::mla_kv_expand_sm90";
  if (keys <= 0 || heads <= 0) return invalid_argument(std::string(name) + ": need keys > 0 and heads > 0");
  const int64_t n_dim = heads * head_width;
  const int64_t key_blocks = (keys + kBlockM - 1) / kBlockM, col_blocks = (n_dim + kBlockN - 1) / kBlockN;
  if (n_dim > INT32_MAX - kBlockN || keys > INT32_MAX || latent_dim > (1 << 30) || key_blocks * col_blocks > INT32_MAX)
    return out_of_range(std::string(name) + ": shapes past one launch's 32-bit indices");
  CUtensorMap a_map, w_map;
  const uint64_t a_dims[2] = {static_cast<uint64_t>(latent_dim), static_cast<uint64_t>(keys)};
  const uint64_t a_strides[1] = {static_cast<uint64_t>(row_width)};
  const uint64_t w_dims[2] = {static_cast<uint64_t>(latent_dim), static_cast<uint64_t>(n_dim)};
  const uint64_t w_strides[1] = {static_cast<uint64_t>(latent_dim)};
  const uint32_t a_box[2] = {kBlockK, kBlockM}, w_box[2] = {kBlockK, kBoxRows};
  KILN_RETURN_IF_ERROR(make_bf16_tensor_map_128b(&a_map, latent, 2, a_dims, a_strides, a_box, name));
  KILN_RETURN_IF_ERROR(make_bf16_tensor_map_128b(&w_map, kv_b, 2, w_dims, w_strides, w_box, name));
  // Per call, not once: the attribute is per device.
  KILN_RETURN_IF_ERROR(check_cuda(cudaFuncSetAttribute(mla_kv_expand_sm90_kernel,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(kAlloc)),
                                  name));
  int dev = 0, sms = 0;
  KILN_RETURN_IF_ERROR(check_cuda(cudaGetDevice(&dev), name));
  KILN_RETURN_IF_ERROR(check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), name));
  const int64_t tiles = key_blocks * col_blocks;
  const ExpandArgs args{static_cast<int>(keys),       static_cast<int>(latent_dim), static_cast<int>(n_dim),
                        static_cast<int>(head_width), static_cast<int>(col_blocks), static_cast<int>(tiles), out};
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, std::max(sms, 1)));
  mla_kv_expand_sm90_kernel<<<grid, kThreads, kAlloc, stream>>>(args, a_map, w_map);
  return check_launch(name);
}

}  // namespace kiln::cuda
