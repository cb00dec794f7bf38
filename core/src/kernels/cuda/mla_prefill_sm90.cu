#include <cmath>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mla_prefill_order.cuh"
#include "kernels/cuda/mla_prefill_sm90.h"
#include "kiln/cuda/mbarrier.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBlockM = 128;  // query rows per CTA: 64 per consumer warpgroup
constexpr int kBlockN = 64;   // keys per tile
constexpr int kThreads = 384;  // warpgroup 0 loads, warpgroups 1 and 2 compute
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128·24 + 256·240 ≤ 64K registers
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory: Q [128][qk], two K tiles [64][qk], two V tiles [64][v], each a run of 128-byte-swizzled column
// blocks of 64 (wgmma.cuh; one TMA box each), then the ring's mbarriers. Every tile offset is a multiple of 1024
// bytes, as the swizzle's base offset 0 needs.
template <int kNope, int kRope, int kV>
struct Sm90Layout {
  static constexpr int kQk = kNope + kRope;
  static_assert(kNope % 64 == 0 && kRope % 64 == 0 && kV % 64 == 0, "column blocks of 64 (one TMA box each)");
  static constexpr uint32_t kKTile = kBlockN * kQk * 2;
  static constexpr uint32_t kVTile = kBlockN * kV * 2;
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kK = kQ + kBlockM * kQk * 2;
  static constexpr uint32_t kVOff = kK + 2 * kKTile;
  static constexpr uint32_t kBytes = kVOff + 2 * kVTile;
  static constexpr uint32_t kBarriers = kBytes;  // 8 mbarriers of 8 bytes
  static constexpr size_t kAlloc = kBytes + 64 + 1024;  // the dynamic window is only 16-byte aligned: room to round up
};

template <int kV>
__device__ __forceinline__ void wgmma_pv(float (&o)[kV / 2], const uint32_t (&a)[4], uint64_t desc_v) {
  if constexpr (kV == 256)
    wgmma_m64n256k16_rs(o, a, desc_v);
  else
    wgmma_m64n128k16_rs(o, a, desc_v);
}

// K_nope [keys][H][nope] and V [keys][H][v] as 3-d maps (dim, head, key), k_rope [keys][rope] as a 2-d one; boxes of
// 64 columns × 64 keys.
struct Sm90TensorMaps {
  CUtensorMap k_nope, k_rope, v;
};

// grid: as mla_prefill.cu's (heads_fastest picks its order). One thread of warpgroup 0 streams K(t) / V(t) through two-deep rings with
// TMA, in the order the consumers use them (K0, K1, V0, K2, V1, ...). Consumer warpgroup wg owns query rows
// 64·wg .. 64·wg + 63 of the CTA's 128 (in it warp w owns 16 rows, thread (g, c) rows g and g + 8: wgmma.cuh's
// layout) and per tile t issues S(t) = Q·K(t)ᵀ and O += P(t − 1)·V(t − 1), waits for S(t), runs the online softmax of
// tile t while the value product is still on the tensor cores, then waits for that. The consumers run unsynchronized
// with each other (the rings' mbarriers are their only link), so one's softmax also overlaps the other's products;
// enforcing turns (FlashAttention-3's ping-pong) measured no better at 32K / 128K and worse at 4K.
template <int kNope, int kRope, int kV>
__global__ void __launch_bounds__(kThreads, 1)
    mla_prefill_sm90_kernel(const MlaPrefillParams p, const __grid_constant__ Sm90TensorMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Sm90Layout<kNope, kRope, kV>;
  constexpr int kQk = L::kQk;
  constexpr int kQkChunks = kQk / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw_addr);
  // k_full[2], v_full[2]: the producer's expect_tx arrival + the copies' bytes; k_empty[2], v_empty[2]: the
  // consumers' 8 warps arrive.
  const uint32_t bars = base + L::kBarriers;
  auto k_full = [&](int buf) { return bars + 8 * buf; };
  auto v_full = [&](int buf) { return bars + 16 + 8 * buf; };
  auto k_empty = [&](int buf) { return bars + 32 + 8 * buf; };
  auto v_empty = [&](int buf) { return bars + 48 + 8 * buf; };

  const MlaPrefillSeq seq = p.seqs[blockIdx.z];
  const int num_m_tiles = (seq.q_len + kBlockM - 1) / kBlockM;
  // Later query tiles see more keys: launched first (mla_prefill_order.cuh).
  const MlaPrefillBlock blk = mla_prefill_block(p);
  const int m_tile = blk.m_tile, head = blk.head;
  if (m_tile >= num_m_tiles) return;
  const int m0 = m_tile * kBlockM;
  const int tid = threadIdx.x;
  const int last_pos = seq.kv_len - seq.q_len + min(m0 + kBlockM, seq.q_len) - 1;
  const int n_tiles = (last_pos + 1 + kBlockN - 1) / kBlockN;  // keys 0 .. last_pos (≤ kv_len − 1)

  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(k_full(b), 1);
      mbarrier_init(v_full(b), 1);
      mbarrier_init(k_empty(b), 8);
      mbarrier_init(v_empty(b), 8);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  if (tid < 128) {
    warpgroup_reg_dealloc<kProducerRegs>();
    if (tid == 0) {
      // Keys past the sequence's kv_len arrive too (the next sequence's, or zeros past total_keys): the mask drops
      // them from S, and their P of exactly 0 keeps their (finite) V out of O.
      const int key0 = seq.key_start;
      auto load_k = [&](int t) {
        mbarrier_wait(k_empty(t & 1), ((t >> 1) & 1) ^ 1);
        const uint32_t dst = base + L::kK + (t & 1) * L::kKTile, bar = k_full(t & 1);
        mbarrier_arrive_expect_tx(bar, L::kKTile);
#pragma unroll
        for (int b = 0; b < kNope / 64; ++b) tma_load_3d(dst + b * kBlockN * 128, &maps.k_nope, 64 * b, head, key0 + t * kBlockN, bar);
#pragma unroll
        for (int b = 0; b < kRope / 64; ++b)
          tma_load_2d(dst + (kNope / 64 + b) * kBlockN * 128, &maps.k_rope, 64 * b, key0 + t * kBlockN, bar);
      };
      auto load_v = [&](int t) {
        mbarrier_wait(v_empty(t & 1), ((t >> 1) & 1) ^ 1);
        const uint32_t dst = base + L::kVOff + (t & 1) * L::kVTile, bar = v_full(t & 1);
        mbarrier_arrive_expect_tx(bar, L::kVTile);
#pragma unroll
        for (int b = 0; b < kV / 64; ++b) tma_load_3d(dst + b * kBlockN * 128, &maps.v, 64 * b, head, key0 + t * kBlockN, bar);
      };
      for (int t = 0; t <= n_tiles; ++t) {
        if (t < n_tiles) load_k(t);
        if (t >= 1) load_v(t - 1);
      }
    }
  } else {
    warpgroup_reg_alloc<kConsumerRegs>();
    const int ctid = tid - 128, wg = ctid / 128, warp = (ctid / 32) % 4, lane = ctid % 32;
    const int g = lane / 4, c = lane % 4;
    const int first_pos = seq.kv_len - seq.q_len + m0;
    const int wg_first_pos = first_pos + 64 * wg;

    // This warpgroup's 64 query rows (rows past q_len are zero; they are never written out).
    {
      const int wtid = ctid % 128;
      const uint16_t* q_base =
          p.q + static_cast<int64_t>(seq.q_row + m0) * p.q_row_stride + static_cast<int64_t>(head) * kQk;
      for (int i = wtid; i < 64 * kQkChunks; i += 128) {
        const int r = 64 * wg + i / kQkChunks, ch = i % kQkChunks;
        uint4 packed = make_uint4(0, 0, 0, 0);
        if (m0 + r < seq.q_len)
          packed = *reinterpret_cast<const uint4*>(q_base + static_cast<int64_t>(r) * p.q_row_stride + ch * 8);
        *reinterpret_cast<uint4*>(smem + L::kQ + smem_swizzle_128b_offset(r, ch, kBlockM)) = packed;
      }
      fence_proxy_async_shared();
      named_barrier_sync(1 + wg, 128);
    }

    float o[kV / 2];
#pragma unroll
    for (int i = 0; i < kV / 2; ++i) o[i] = 0.f;
    uint32_t p_frag[16];
    auto issue_pv = [&](int tile) {
      const uint32_t v_addr = base + L::kVOff + (tile & 1) * L::kVTile;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint32_t a[4] = {p_frag[4 * kk], p_frag[4 * kk + 1], p_frag[4 * kk + 2], p_frag[4 * kk + 3]};
        wgmma_pv<kV>(o, a, wgmma_desc_128b(v_addr + kk * 16 * 128, kBlockN * 128, 1024));
      }
      wgmma_commit();
    };
    auto rescale_o = [&](const float (&alpha)[2]) {
      // Past the first tiles a row's running max rarely moves (alpha exactly 1): skip the 128 multiplies when no row
      // of the warp needs them (the same bits).
      if (__all_sync(~0u, alpha[0] == 1.f && alpha[1] == 1.f)) return;
#pragma unroll
      for (int j = 0; j < kV / 8; ++j) {
        o[4 * j] *= alpha[0], o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1], o[4 * j + 3] *= alpha[1];
      }
    };
    float row_max[2] = {-INFINITY, -INFINITY};  // running max of scale·log2e·score, rows g and g+8
    float row_sum[2] = {0.f, 0.f};              // this thread's share of the running softmax denominator
    float alpha[2] = {0.f, 0.f};                // o's rescale before the next value product
    const float scale_log2 = p.scale * kLog2e;
    const int row_pos[2] = {wg_first_pos + warp * 16 + g, wg_first_pos + warp * 16 + g + 8};
    const uint32_t q_addr = base + L::kQ + wg * 64 * 128;
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;

    for (int tile = 0; tile < n_tiles; ++tile) {
      mbarrier_wait(k_full(tile & 1), (tile >> 1) & 1);
      wgmma_fence();
      {
        const uint32_t k_addr = base + L::kK + (tile & 1) * L::kKTile;
#pragma unroll
        for (int ks = 0; ks < kQk / 16; ++ks) {
          const uint32_t blk = ks / 4, off = (ks % 4) * 32;
          wgmma_m64n64k16_ss(s, wgmma_desc_128b(q_addr + blk * kBlockM * 128 + off, 16, 1024),
                             wgmma_desc_128b(k_addr + blk * kBlockN * 128 + off, 16, 1024), ks > 0);
        }
      }
      wgmma_commit();
      // o's rescale while S(tile) runs (o is no operand of it; ptxas still waits for S before the value product is
      // issued). Measured on an H100 against rescaling before the score product (where ptxas interleaves the
      // multiplies with the score wgmmas): 8K / 16K / 32K keys 9 / 9 / 2 % faster, 4K and 128K the same.
      rescale_o(alpha);
      if (tile > 0) {
        mbarrier_wait(v_full((tile - 1) & 1), ((tile - 1) >> 1) & 1);
        wgmma_fence();
        issue_pv(tile - 1);
        wgmma_wait<1>();  // S(tile) done; the value product may still run
      } else {
        wgmma_wait<0>();
      }
      wgmma_pin(s);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(k_empty(tile & 1));  // K(tile) read

      // Causal mask, only on tiles that reach past the warpgroup's first row (key > position, or key ≥ kv_len for
      // the padding rows past q_len, whose positions run past the sequence).
      const int n0 = tile * kBlockN;
      if (n0 + kBlockN - 1 > wg_first_pos) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + j * 8 + 2 * c + (e & 1);
            if (key > row_pos[e / 2] || key >= seq.kv_len) s[4 * j + e] = -INFINITY;
          }
      }
      // Online softmax in base 2; a row's 64 scores are spread over the 4 threads of its quad.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 2));
        const float m_new = fmaxf(row_max[half], mx * scale_log2);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays all-zero
        alpha[half] = exp2f(row_max[half] - m_use);
        row_max[half] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 2 * half; e < 2 * half + 2; ++e) {
            const float pe = exp2f(fmaf(s[4 * j + e], scale_log2, -m_use));
            s[4 * j + e] = pe;
            sum += pe;
          }
        row_sum[half] = row_sum[half] * alpha[half] + sum;
      }

      wgmma_wait<0>();  // PV(tile − 1) done: o and P(tile − 1) are free
      wgmma_pin(o);
      wgmma_pin(p_frag);
      if (tile > 0) {
        __syncwarp();
        if (lane == 0) mbarrier_arrive(v_empty((tile - 1) & 1));  // V(tile − 1) read
      }
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        p_frag[4 * kk] = pack_bf16x2(s[8 * kk], s[8 * kk + 1]);
        p_frag[4 * kk + 1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
        p_frag[4 * kk + 2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
        p_frag[4 * kk + 3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
      }
    }

    // The last tile's value product, then out = O / l for the rows of this sequence.
    rescale_o(alpha);
    mbarrier_wait(v_full((n_tiles - 1) & 1), ((n_tiles - 1) >> 1) & 1);
    wgmma_fence();
    issue_pv(n_tiles - 1);
    wgmma_wait<0>();
    wgmma_pin(o);

#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = row_sum[half];
      l += __shfl_xor_sync(~0u, l, 1);
      l += __shfl_xor_sync(~0u, l, 2);
      const int r = m0 + 64 * wg + warp * 16 + g + 8 * half;
      if (r >= seq.q_len) continue;
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
      uint16_t* dst = p.out + static_cast<int64_t>(seq.q_row + r) * p.out_row_stride + static_cast<int64_t>(head) * kV + 2 * c;
#pragma unroll
      for (int j = 0; j < kV / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + j * 8) = pack_bf16x2(o[4 * j + 2 * half] * inv_l, o[4 * j + 2 * half + 1] * inv_l);
    }
  }
#else
  __trap();  // sm_90a only; mla_prefill_sm90_applies keeps other devices off this kernel
#endif
}

// The tensor maps are encoded per call (host only, no device work): their base pointers and key extent change.
template <int kNope, int kRope, int kV>
Status launch(const MlaPrefillParams& p, StreamHandle stream) {
  Sm90TensorMaps maps;
  const uint64_t keys = static_cast<uint64_t>(p.total_keys), heads = static_cast<uint64_t>(p.num_heads);
  const uint32_t box3[3] = {64, 1, kBlockN}, box2[2] = {64, kBlockN};
  {
    const uint64_t dims[3] = {kNope, heads, keys};
    const uint64_t strides[2] = {static_cast<uint64_t>(p.k_nope_head_stride), static_cast<uint64_t>(p.k_nope_key_stride)};
    KILN_RETURN_IF_ERROR(make_bf16_tensor_map_128b(&maps.k_nope, p.k_nope, 3, dims, strides, box3, "cuda::mla_prefill_sm90: k_nope map"));
  }
  {
    const uint64_t dims[2] = {kRope, keys};
    const uint64_t strides[1] = {static_cast<uint64_t>(p.k_rope_key_stride)};
    KILN_RETURN_IF_ERROR(make_bf16_tensor_map_128b(&maps.k_rope, p.k_rope, 2, dims, strides, box2, "cuda::mla_prefill_sm90: k_rope map"));
  }
  {
    const uint64_t dims[3] = {kV, heads, keys};
    const uint64_t strides[2] = {static_cast<uint64_t>(p.v_head_stride), static_cast<uint64_t>(p.v_key_stride)};
    KILN_RETURN_IF_ERROR(make_bf16_tensor_map_128b(&maps.v, p.v, 3, dims, strides, box3, "cuda::mla_prefill_sm90: v map"));
  }
  constexpr size_t kBytes = Sm90Layout<kNope, kRope, kV>::kAlloc;
  static const cudaError_t attr = cudaFuncSetAttribute(mla_prefill_sm90_kernel<kNope, kRope, kV>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  KILN_RETURN_IF_ERROR(check_cuda(attr, "cuda::mla_prefill_sm90: shared memory limit"));
  const dim3 grid = mla_prefill_grid(p, kBlockM);
  mla_prefill_sm90_kernel<kNope, kRope, kV><<<grid, kThreads, kBytes, stream>>>(p, maps);
  return check_launch("cuda::mla_prefill_sm90");
}

}  // namespace

bool mla_prefill_sm90_applies(int64_t nope_dim, int64_t rope_dim, int64_t v_dim) {
  const bool dims = (nope_dim == 192 && rope_dim == 64 && v_dim == 256) || (nope_dim == 128 && rope_dim == 64 && v_dim == 128);
  if (!dims) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

Status mla_prefill_sm90(const MlaPrefillParams& p, StreamHandle stream) {
  if (p.total_keys <= 0) return invalid_argument("cuda::mla_prefill_sm90: total_keys must be set");
  if (p.nope_dim == 192 && p.rope_dim == 64 && p.v_dim == 256) return launch<192, 64, 256>(p, stream);
  if (p.nope_dim == 128 && p.rope_dim == 64 && p.v_dim == 128) return launch<128, 64, 128>(p, stream);
  return invalid_argument("cuda::mla_prefill_sm90: no Hopper kernel for these head dims");
}

}  // namespace kiln::cuda
