#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/mla_prefill.h"
#include "kernels/cuda/mla_prefill_order.cuh"
#include "kernels/cuda/mla_prefill_sm90.h"

namespace kiln::cuda {
namespace {

constexpr int kBlockM = 128;  // query rows per CTA: 16 per warp
constexpr int kBlockN = 64;   // keys per tile
constexpr int kWarps = kBlockM / 16;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

// Shared-memory rows padded by 16 bytes: every dim used here is a multiple of 64 elements, so the pitch is 16 bytes
// past a multiple of 128 and the eight 16-byte rows an ldmatrix reads fall in distinct bank groups.
template <int kNope, int kRope, int kV>
struct Tile {
  static constexpr int kQk = kNope + kRope;
  static constexpr int kQkPitch = kQk + 8;
  static constexpr int kVPitch = kV + 8;
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + sizeof(uint16_t) * kBlockM * kQkPitch;
  static constexpr size_t kVOff = kK + sizeof(uint16_t) * kBlockN * kQkPitch;
  static constexpr size_t kBytes = kVOff + sizeof(uint16_t) * kBlockN * kVPitch;
};

// grid: (heads, query tiles, sequences) or (query tiles, heads, sequences) as MlaPrefillParams::heads_fastest says,
// each head's query tiles longest first. Warp w owns query rows 16w..16w+15 of the CTA's 128; mma fragment
// layout: thread (g = lane/4, c = lane%4) holds rows g and g+8, columns 2c and 2c+1 of each 8-wide n-tile.
template <int kNope, int kRope, int kV>
__global__ void __launch_bounds__(kThreads, 1) mla_prefill_kernel(MlaPrefillParams p) {
  using T = Tile<kNope, kRope, kV>;
  constexpr int kQk = T::kQk;
  constexpr int kNTiles = kBlockN / 8;  // score n-tiles per warp
  constexpr int kOTiles = kV / 8;       // output n-tiles per warp
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* s_q = reinterpret_cast<uint16_t*>(smem + T::kQ);
  uint16_t* s_k = reinterpret_cast<uint16_t*>(smem + T::kK);
  uint16_t* s_v = reinterpret_cast<uint16_t*>(smem + T::kVOff);

  const MlaPrefillSeq seq = p.seqs[blockIdx.z];
  const int num_m_tiles = (seq.q_len + kBlockM - 1) / kBlockM;
  // Later query tiles see more keys: launched first (mla_prefill_order.cuh).
  const MlaPrefillBlock blk = mla_prefill_block(p);
  const int m_tile = blk.m_tile, head = blk.head;
  if (m_tile >= num_m_tiles) return;
  const int m0 = m_tile * kBlockM;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int first_pos = seq.kv_len - seq.q_len + m0;  // position of the CTA's first row
  const int last_pos = seq.kv_len - seq.q_len + min(m0 + kBlockM, seq.q_len) - 1;
  const int n_tiles = (last_pos + 1 + kBlockN - 1) / kBlockN;  // keys 0 .. last_pos (≤ kv_len − 1)

  // Q tile → shared memory (rows past q_len are zero; they are never written out).
  {
    constexpr int kOcts = kQk / 8;
    const uint16_t* q_base =
        p.q + static_cast<int64_t>(seq.q_row + m0) * p.q_row_stride + static_cast<int64_t>(head) * kQk;
    for (int i = tid; i < kBlockM * kOcts; i += kThreads) {
      const int r = i / kOcts, col = (i % kOcts) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (m0 + r < seq.q_len) v = *reinterpret_cast<const uint4*>(q_base + static_cast<int64_t>(r) * p.q_row_stride + col);
      *reinterpret_cast<uint4*>(s_q + r * T::kQkPitch + col) = v;
    }
  }

  const uint16_t* k_nope = p.k_nope + static_cast<int64_t>(head) * p.k_nope_head_stride;
  const uint16_t* v_head = p.v + static_cast<int64_t>(head) * p.v_head_stride;
  auto issue_k = [&](int tile) {
    constexpr int kChunks = kQk / 8, kNopeChunks = kNope / 8;
    for (int i = tid; i < kBlockN * kChunks; i += kThreads) {
      const int r = i / kChunks, ch = i % kChunks;
      const int key = tile * kBlockN + r;
      const bool valid = key < seq.kv_len;
      const int64_t k = seq.key_start + (valid ? key : 0);
      const uint16_t* src = ch < kNopeChunks ? k_nope + k * p.k_nope_key_stride + ch * 8
                                             : p.k_rope + k * p.k_rope_key_stride + (ch - kNopeChunks) * 8;
      cp_async_16(s_k + r * T::kQkPitch + ch * 8, src, valid);
    }
    cp_async_commit();
  };
  auto issue_v = [&](int tile) {
    constexpr int kChunks = kV / 8;
    for (int i = tid; i < kBlockN * kChunks; i += kThreads) {
      const int r = i / kChunks, ch = i % kChunks;
      const int key = tile * kBlockN + r;
      const bool valid = key < seq.kv_len;
      const int64_t k = seq.key_start + (valid ? key : 0);
      cp_async_16(s_v + r * T::kVPitch + ch * 8, v_head + k * p.v_key_stride + ch * 8, valid);
    }
    cp_async_commit();
  };

  float acc_o[kOTiles][4];
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[nt][e] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // running max of scale·log2e·score, rows g and g+8
  float row_sum[2] = {0.f, 0.f};              // this thread's share of the running softmax denominator
  const float scale_log2 = p.scale * kLog2e;
  const int row_pos[2] = {first_pos + warp * 16 + g, first_pos + warp * 16 + g + 8};

  issue_k(0);
  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait_all();
    __syncthreads();  // K(tile) landed; every warp is done with V(tile − 1)
    issue_v(tile);

    // S = Q · K(tile)ᵀ, 16 rows × 64 keys per warp.
    float s[kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
    {
      const uint16_t* q_ptr = s_q + (warp * 16 + lane % 16) * T::kQkPitch + (lane / 16) * 8;
      const uint16_t* k_ptr = s_k + ((lane / 16) * 8 + lane % 8) * T::kQkPitch + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int ks = 0; ks < kQk / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, q_ptr + ks * 16);
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, k_ptr + np * 16 * T::kQkPitch + ks * 16);
          mma_bf16_16816(s[2 * np], a, b[0], b[1]);
          mma_bf16_16816(s[2 * np + 1], a, b[2], b[3]);
        }
      }
    }

    // Causal mask, only on tiles that reach past the CTA's first row (key > position, or key ≥ kv_len for the
    // padding rows past q_len, whose positions run past the sequence).
    const int n0 = tile * kBlockN;
    if (n0 + kBlockN - 1 > first_pos) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + nt * 8 + 2 * c + (e & 1);
          if (key > row_pos[e / 2] || key >= seq.kv_len) s[nt][e] = -INFINITY;
        }
    }

    // Online softmax in base 2; a row's 64 scores are spread over the 4 threads of its quad.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 2));
      const float m_new = fmaxf(row_max[half], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays all-zero
      const float alpha = exp2f(row_max[half] - m_use);
      row_max[half] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          const float pe = exp2f(fmaf(s[nt][e], scale_log2, -m_use));
          s[nt][e] = pe;
          sum += pe;
        }
      row_sum[half] = row_sum[half] * alpha + sum;
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt) {
        acc_o[nt][2 * half] *= alpha;
        acc_o[nt][2 * half + 1] *= alpha;
      }
    }

    cp_async_wait_all();
    __syncthreads();  // V(tile) landed; every warp is done with K(tile)
    if (tile + 1 < n_tiles) issue_k(tile + 1);

    // O += P · V(tile): P straight from the score registers (an S accumulator pair is an A fragment).
    {
      const uint16_t* v_ptr = s_v + (lane % 8 + ((lane / 8) % 2) * 8) * T::kVPitch + (lane / 16) * 8;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint32_t a[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                               pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < kOTiles / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_ptr + kk * 16 * T::kVPitch + np * 16);
          mma_bf16_16816(acc_o[2 * np], a, b[0], b[1]);
          mma_bf16_16816(acc_o[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
  }

  // out = O / l for the rows of this sequence.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = row_sum[half];
    l += __shfl_xor_sync(~0u, l, 1);
    l += __shfl_xor_sync(~0u, l, 2);
    const int r = m0 + warp * 16 + g + 8 * half;
    if (r >= seq.q_len) continue;
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    uint16_t* dst = p.out + static_cast<int64_t>(seq.q_row + r) * p.out_row_stride + static_cast<int64_t>(head) * kV + 2 * c;
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt)
      *reinterpret_cast<uint32_t*>(dst + nt * 8) =
          pack_bf16x2(acc_o[nt][2 * half] * inv_l, acc_o[nt][2 * half + 1] * inv_l);
  }
}

// Any dims: one CTA per (row, head, sequence), fp32 throughout. Keys go in chunks of kGenericThreads: each thread
// scores one key, the block merges the chunk into the running softmax, then threads sweep the value columns.
constexpr int kGenericThreads = 128;

__device__ float block_reduce(float v, bool is_max, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(~0u, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  __syncthreads();  // red is free again
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < kGenericThreads / 32; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

__global__ void __launch_bounds__(kGenericThreads) mla_prefill_generic_kernel(MlaPrefillParams p) {
  extern __shared__ float gsmem[];
  const int64_t qk = p.nope_dim + p.rope_dim;
  float* s_q = gsmem;           // [qk]
  float* s_acc = s_q + qk;      // [v]
  float* s_p = s_acc + p.v_dim; // [kGenericThreads]
  __shared__ float red[kGenericThreads / 32];
  const MlaPrefillSeq seq = p.seqs[blockIdx.z];
  const int i = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
  if (i >= seq.q_len) return;
  const int n_keys = seq.kv_len - seq.q_len + i + 1;
  const uint16_t* q = p.q + static_cast<int64_t>(seq.q_row + i) * p.q_row_stride + head * qk;
  for (int64_t d = tid; d < qk; d += kGenericThreads) s_q[d] = bf16_bits_to_float(q[d]);
  for (int64_t d = tid; d < p.v_dim; d += kGenericThreads) s_acc[d] = 0.f;
  __syncthreads();
  float m = -INFINITY, l = 0.f;
  for (int j0 = 0; j0 < n_keys; j0 += kGenericThreads) {
    const int j = j0 + tid;
    float s = -INFINITY;
    if (j < n_keys) {
      const int64_t k = seq.key_start + j;
      const uint16_t* kn = p.k_nope + k * p.k_nope_key_stride + head * p.k_nope_head_stride;
      const uint16_t* kr = p.k_rope + k * p.k_rope_key_stride;
      float dot = 0.f;
      for (int64_t d = 0; d < p.nope_dim; ++d) dot += s_q[d] * bf16_bits_to_float(kn[d]);
      for (int64_t d = 0; d < p.rope_dim; ++d) dot += s_q[p.nope_dim + d] * bf16_bits_to_float(kr[d]);
      s = dot * p.scale;
    }
    const float m_new = fmaxf(m, block_reduce(s, true, red));  // finite: key j0 is always visible
    const float alpha = expf(m - m_new);
    const float e = j < n_keys ? expf(s - m_new) : 0.f;
    s_p[tid] = e;
    l = l * alpha + block_reduce(e, false, red);  // its barriers also publish s_p
    m = m_new;
    const int n = min(kGenericThreads, n_keys - j0);
    for (int64_t d = tid; d < p.v_dim; d += kGenericThreads) {
      float acc = s_acc[d] * alpha;
      for (int jj = 0; jj < n; ++jj)
        acc += s_p[jj] * bf16_bits_to_float(p.v[(seq.key_start + j0 + jj) * p.v_key_stride + head * p.v_head_stride + d]);
      s_acc[d] = acc;
    }
    __syncthreads();  // s_p is rewritten by the next chunk
  }
  uint16_t* out = p.out + static_cast<int64_t>(seq.q_row + i) * p.out_row_stride + head * p.v_dim;
  for (int64_t d = tid; d < p.v_dim; d += kGenericThreads) out[d] = float_to_bf16_bits(s_acc[d] / l);
}

template <int kNope, int kRope, int kV>
Status launch_fast(const MlaPrefillParams& p, StreamHandle stream) {
  constexpr size_t kBytes = Tile<kNope, kRope, kV>::kBytes;
  static const cudaError_t attr = cudaFuncSetAttribute(mla_prefill_kernel<kNope, kRope, kV>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  KILN_RETURN_IF_ERROR(check_cuda(attr, "cuda::mla_prefill_bf16: shared memory limit"));
  const dim3 grid = mla_prefill_grid(p, kBlockM);
  mla_prefill_kernel<kNope, kRope, kV><<<grid, kThreads, kBytes, stream>>>(p);
  return check_launch("cuda::mla_prefill_bf16");
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// cp.async moves 16-byte chunks and q is read 8 values at a time: every row / head start must be 16-byte aligned.
bool fast_layout_ok(const MlaPrefillParams& p) {
  return aligned16(p.q) && p.q_row_stride % 8 == 0 && aligned16(p.k_nope) && aligned16(p.k_rope) && aligned16(p.v) &&
         p.k_nope_key_stride % 8 == 0 && p.k_nope_head_stride % 8 == 0 && p.k_rope_key_stride % 8 == 0 &&
         p.v_key_stride % 8 == 0 && p.v_head_stride % 8 == 0 && reinterpret_cast<uintptr_t>(p.out) % 4 == 0 &&
         p.out_row_stride % 2 == 0;
}

}  // namespace

bool mla_prefill_has_fast_path(int64_t nope_dim, int64_t rope_dim, int64_t v_dim) {
  return (nope_dim == 192 && rope_dim == 64 && v_dim == 256) || (nope_dim == 128 && rope_dim == 64 && v_dim == 128);
}

Status mla_prefill_bf16(const MlaPrefillParams& params, StreamHandle stream) {
  // Groups wider than the head count are one group of all heads (and keep the kernels' index products within
  // heads · tiles, checked below).
  MlaPrefillParams p = params;
  p.head_group = std::min(p.head_group, p.num_heads);
  if (p.num_seqs < 0 || p.num_heads <= 0 || p.nope_dim < 0 || p.rope_dim < 0 || p.v_dim <= 0 ||
      p.nope_dim + p.rope_dim <= 0)
    return invalid_argument("cuda::mla_prefill_bf16: need num_heads > 0, v_dim > 0 and nope_dim + rope_dim > 0");
  if (!(p.scale > 0.f)) return invalid_argument("cuda::mla_prefill_bf16: scale must be > 0");
  if (p.num_seqs > 65535 || p.num_heads > 65535)
    return invalid_argument("cuda::mla_prefill_bf16: at most 65535 sequences and heads");
  if (p.num_seqs == 0 || p.max_q_len <= 0) return ok_status();
  if (p.head_group < 0) return invalid_argument("cuda::mla_prefill_bf16: head_group must be ≥ 0");
  if (p.head_group > 0 && p.num_heads * ((p.max_q_len + kBlockM - 1) / kBlockM) > INT32_MAX)
    return invalid_argument("cuda::mla_prefill_bf16: too many query tiles for the grouped block order");
  if (p.head_group == 0 && p.heads_fastest && (p.max_q_len + kBlockM - 1) / kBlockM > 65535)
    return invalid_argument("cuda::mla_prefill_bf16: at most 65535 query tiles of 128 rows a sequence");
  if (!p.q || !p.k_nope || (p.rope_dim > 0 && !p.k_rope) || !p.v || !p.out || !p.seqs)
    return invalid_argument("cuda::mla_prefill_bf16: q, k_nope, k_rope, v, out and seqs must be set");
  if (fast_layout_ok(p)) {
    if (p.use_wgmma && p.total_keys > 0 && mla_prefill_sm90_applies(p.nope_dim, p.rope_dim, p.v_dim))
      return mla_prefill_sm90(p, stream);
    if (p.nope_dim == 192 && p.rope_dim == 64 && p.v_dim == 256) return launch_fast<192, 64, 256>(p, stream);
    if (p.nope_dim == 128 && p.rope_dim == 64 && p.v_dim == 128) return launch_fast<128, 64, 128>(p, stream);
  }
  const size_t smem = sizeof(float) * static_cast<size_t>(p.nope_dim + p.rope_dim + p.v_dim + kGenericThreads);
  if (smem > 48 * 1024) return invalid_argument("cuda::mla_prefill_bf16: head dims too large for the generic kernel");
  if (p.max_q_len > INT32_MAX) return invalid_argument("cuda::mla_prefill_bf16: max_q_len out of range");
  const dim3 grid(static_cast<unsigned>(p.max_q_len), static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_seqs));
  mla_prefill_generic_kernel<<<grid, kGenericThreads, smem, stream>>>(p);
  return check_launch("cuda::mla_prefill_bf16 (generic)");
}

}  // namespace kiln::cuda
