#include <cmath>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/launch_check.cuh"
#include "kiln/cuda/mbarrier.cuh"
#include "kernels/cuda/mla_decode_sm90.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kiln/cuda/mla_decode_tc.cuh"

namespace kiln::cuda {
namespace {

using mla_tc::kLog2e;
using mla_tc::kOutStride;

constexpr int kKeys = 64;    // keys per tile: the 64 rows of the score product
constexpr int kPairs = 32;   // (row, head) pairs per CTA: the columns of both products
constexpr int kThreads = 384;  // warpgroup 0 streams the tiles, warpgroups 1 and 2 compute
constexpr int kConsumers = 256;
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128·24 + 256·240 ≤ 64K registers
constexpr uint32_t kBlockBytes = kKeys * 128;  // one 64-column block of a tile: 64 rows of 128 bytes

// Shared memory (every tile 1024-byte aligned, as the 128-byte swizzle needs): q as bf16 [kPairs][row] in
// 64-column blocks; two tile slots of [kKeys][row]; the two warpgroups' partial scores [slot][wg][16 × 128 threads]
// fp32; per warpgroup its Pᵀ operand [kPairs][kKeys] bf16 and its max / sum partials [2][4 warps][kPairs]; the
// softmax state for finish_splits; the four mbarriers. After the loop q's space and slot 0 hold the output
// [kPairs][kOutStride], slot 1 the merge's scratch.
template <int kRope>
struct Layout {
  static constexpr int kRow = static_cast<int>(kMlaLatentDim) + kRope;
  static constexpr int kBlocks = kRow / 64;
  static constexpr uint32_t kSlotBytes = kBlocks * kBlockBytes;
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kSlots = kQ + kBlocks * kPairs * 128;
  static constexpr uint32_t kScores = kSlots + 2 * kSlotBytes;
  static constexpr uint32_t kP = kScores + 2 * 2 * kKeys * kPairs * 4;
  static constexpr uint32_t kRed = kP + 2 * kPairs * 128;
  static constexpr uint32_t kStats = kRed + 2 * 2 * 4 * kPairs * 4;  // max, sum [kPairs]
  static constexpr uint32_t kBars = kStats + 2 * kPairs * 4;
  static constexpr uint32_t kBytes = kBars + 4 * 8;
  static constexpr size_t kAlloc = kBytes + 1024;  // the dynamic window is only 16-byte aligned: room to round up
  // The score product's k-blocks and the value product's 64-dim blocks of each warpgroup, and the blocks it zeroes
  // in a partial tile (the ones it reads).
  static constexpr int kScoreBlocks0 = (kBlocks + 1) / 2;
  static_assert(kRow % 64 == 0, "whole 64-column blocks");
  static_assert(sizeof(float) * kPairs * kOutStride <= kSlots + kSlotBytes, "the output fits before slot 1");
  static_assert(kAlloc <= 227 * 1024, "one CTA per SM");
};

// Tile i is in slot i % 2 and is read by both consumer warpgroups: warpgroup w multiplies its share of the dims
// (k-blocks [0, kScoreBlocks0) or [kScoreBlocks0, kBlocks)) into partial scores, the two partials meet in shared
// memory and are summed in a fixed order by both (so both run the same online softmax on the same bits), and
// warpgroup w accumulates the output dims 256·w .. 256·w + 255. While the two work on one slot the producer fills
// the other.
template <int kRope, bool kMerge>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_kernel(const MlaDecodeParams p, const __grid_constant__ CUtensorMap map, float* part_out,
                           float* part_lse, unsigned* sync) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<kRope>;
  constexpr int kBlocks = L::kBlocks, kRow = L::kRow;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw_addr);
  const uint32_t bars = base + L::kBars;
  auto full = [&](int slot) { return bars + 8 * slot; };
  auto empty = [&](int slot) { return bars + 16 + 8 * slot; };
  const int tid = threadIdx.x;
  if (tid == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(full(s), 1);
      mbarrier_init(empty(s), 8);  // the consumers' eight warps
    }
    mbarrier_init_fence();
  }
  // q, kv_len, the tables and the newest cache row come from the kernels just before this one.
  pdl_wait();
  pdl_launch_dependents();

  // This CTA's pairs, keys and split: exactly as mla_decode_tc_kernel (the plan is shared).
  const int split = blockIdx.y;
  const mla_tc::CtaWork work = mla_tc::cta_work(p, kPairs);
  if (!work.active) return;  // whole CTA, before any barrier
  const int64_t first_row = work.first_row;
  const int heads = static_cast<int>(p.num_heads);
  const int pairs = work.pairs, ctas = work.ctas, m0 = work.m0, n_pairs = work.n_pairs;
  const int64_t pair_base = work.pair_base;
  const int kv_len = work.kv_len;
  const int64_t tile_begin = work.tile_begin;
  const int n_tiles = static_cast<int>(max(int64_t{0}, work.tile_end - tile_begin));
  __syncthreads();  // the barriers are initialised

  if (tid < 128) {
    warpgroup_reg_dealloc<kProducerRegs>();
    if (tid != 0) return;
    // Only pages holding visible keys are copied (one box per page and column block; pages of 64 or more tokens
    // give one box per block); the consumers zero the rest of a partial tile.
    const int32_t* table = p.block_tables + static_cast<int64_t>(p.query_seq[first_row]) * p.max_blocks;
    const int64_t bs = p.block_size;
    const int box_rows = bs >= kKeys ? kKeys : static_cast<int>(bs);
    for (int i = 0; i < n_tiles; ++i) {
      const int slot = i & 1;
      mbarrier_wait(empty(slot), ((i >> 1) & 1) ^ 1);
      const int64_t key0 = (tile_begin + i) * kKeys;
      const int rows = static_cast<int>(min(int64_t{kKeys}, kv_len - key0));
      const int boxes = (rows + box_rows - 1) / box_rows;
      const uint32_t dst = base + L::kSlots + slot * L::kSlotBytes;
      mbarrier_arrive_expect_tx(full(slot), static_cast<uint32_t>(boxes * box_rows * 128 * kBlocks));
      for (int j = 0; j < boxes; ++j) {
        const int64_t pos = key0 + j * box_rows;
        const int row = static_cast<int>(static_cast<int64_t>(table[pos / bs]) * bs + pos % bs);
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) tma_load_2d(dst + b * kBlockBytes + j * box_rows * 128, &map, 64 * b, row, full(slot));
      }
    }
    return;
  }

  warpgroup_reg_alloc<kConsumerRegs>();
  const int ctid = tid - 128, wg = ctid / 128, wtid = ctid % 128, warp = wtid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;

  // q → bf16 [pair][dim] in 64-column blocks (padding pairs zero), by both consumer warpgroups.
  for (int i = ctid; i < kPairs * kBlocks * 8; i += kConsumers) {
    const int r = i / (kBlocks * 8), ch = i % (kBlocks * 8);
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < n_pairs) {
      const float* src = p.q + (pair_base + r) * kRow + ch * 8;
      const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
      packed = make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w));
    }
    *reinterpret_cast<uint4*>(smem + L::kQ + smem_swizzle_128b_offset(r, ch, kPairs)) = packed;
  }
  fence_proxy_async_shared();
  named_barrier_sync(1, kConsumers);

  // The accumulator layout of both products (wgmma.cuh): element 4j + e of a 64 × 32 tile is row
  // 16·warp + g + 8·(e / 2), column 8j + 2c + (e % 2). The columns are pairs: this thread's eight are
  // col(k) = 8·(k / 2) + 2c + k % 2, k = 2j + e % 2.
  auto col = [&](int k) { return 8 * (k / 2) + 2 * c + (k % 2); };
  int len[8];  // each of this thread's pairs' kv_len (0 for padding pairs)
#pragma unroll
  for (int k = 0; k < 8; ++k) len[k] = col(k) < n_pairs ? p.kv_len[first_row + (m0 + col(k)) / heads] : 0;
  float m_run[8], l_run[8];  // running base-2 max and softmax sum of each of this thread's pairs
#pragma unroll
  for (int k = 0; k < 8; ++k) m_run[k] = -INFINITY, l_run[k] = 0.f;
  float o[4][16];  // Oᵀ: dims 256·wg + 64·mb + row, pairs as columns
#pragma unroll
  for (int mb = 0; mb < 4; ++mb)
#pragma unroll
    for (int e = 0; e < 16; ++e) o[mb][e] = 0.f;
  float s[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) s[e] = 0.f;
  const float scale_log2 = p.scale * kLog2e;
  const int kb0 = wg == 0 ? 0 : L::kScoreBlocks0, kb1 = wg == 0 ? L::kScoreBlocks0 : kBlocks;
  const int zb0 = wg == 0 ? 0 : 4, zb1 = wg == 0 ? max(L::kScoreBlocks0, 4) : kBlocks;  // blocks this wg reads
  const uint32_t q_addr = base + L::kQ;
  const uint32_t p_addr = base + L::kP + wg * kPairs * 128;
  unsigned char* p_tile = smem + L::kP + wg * kPairs * 128;
  float* red_max = reinterpret_cast<float*>(smem + L::kRed) + wg * 2 * 4 * kPairs;
  float* red_sum = red_max + 4 * kPairs;
  const int bar = 2 + wg;  // this warpgroup's named barrier

  for (int i = 0; i < n_tiles; ++i) {
    const int slot = i & 1;
    mbarrier_wait(full(slot), (i >> 1) & 1);
    const int64_t key0 = (tile_begin + i) * kKeys;
    const int rows = static_cast<int>(min(int64_t{kKeys}, kv_len - key0));
    unsigned char* tile = smem + L::kSlots + slot * L::kSlotBytes;
    const uint32_t tile_addr = base + L::kSlots + slot * L::kSlotBytes;
    if (rows < kKeys) {
      // Rows past the CTA's keys hold another sequence's tokens, stale data or nothing written yet: zeros, so
      // their value rows cannot turn P = 0 into NaN. Each warpgroup zeroes the blocks it reads (both write zeros
      // into the one they share).
      const int per_row = (zb1 - zb0) * 8;
      for (int k = wtid; k < (kKeys - rows) * per_row; k += 128) {
        const int r = rows + k / per_row, rest = k % per_row;
        *reinterpret_cast<uint4*>(tile + (zb0 + rest / 8) * kBlockBytes + r * 128 + (rest % 8) * 16) = make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async_shared();
      named_barrier_sync(bar, 128);
    }

    // This warpgroup's partial Sᵀ = K · qᵀ over its k-blocks: keys as rows, pairs as columns.
    wgmma_fence();
    for (int blk = kb0; blk < kb1; ++blk)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n32k16_ss<0>(s, wgmma_desc_128b(tile_addr + blk * kBlockBytes + kk * 32, 16, 1024),
                                wgmma_desc_128b(q_addr + blk * kPairs * 128 + kk * 32, 16, 1024), blk > kb0 || kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(s);
    float* scores = reinterpret_cast<float*>(smem + L::kScores) + slot * 2 * kKeys * kPairs;
#pragma unroll
    for (int e = 0; e < 16; ++e) scores[(wg * 16 + e) * 128 + wtid] = s[e];
    named_barrier_sync(1, kConsumers);
#pragma unroll
    for (int e = 0; e < 16; ++e) s[e] = scores[e * 128 + wtid] + scores[(16 + e) * 128 + wtid];

    // Online softmax per pair (column) over the tile's 64 keys: 2 rows a thread, 8 lanes (g) a warp, 4 warps.
    float mx[8];
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int k = 2 * (e / 4) + (e % 2);
      const int64_t key = key0 + 16 * warp + g + 8 * ((e % 4) / 2);
      s[e] = key < len[k] ? s[e] * scale_log2 : -INFINITY;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int e = 4 * (k / 2) + k % 2;
      float v = fmaxf(s[e], s[e + 2]);
      v = fmaxf(v, __shfl_xor_sync(~0u, v, 4));
      v = fmaxf(v, __shfl_xor_sync(~0u, v, 8));
      v = fmaxf(v, __shfl_xor_sync(~0u, v, 16));
      mx[k] = v;
    }
    if (g == 0)
#pragma unroll
      for (int k = 0; k < 8; ++k) red_max[warp * kPairs + col(k)] = mx[k];
    named_barrier_sync(bar, 128);
    float alpha[8], m_use[8], sum[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float t = red_max[col(k)];
#pragma unroll
      for (int w = 1; w < 4; ++w) t = fmaxf(t, red_max[w * kPairs + col(k)]);
      const float m_new = fmaxf(m_run[k], t);
      m_use[k] = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: stays all zero
      alpha[k] = exp2f(m_run[k] - m_use[k]);
      m_run[k] = m_new;
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) s[e] = exp2f(s[e] - m_use[2 * (e / 4) + (e % 2)]);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int e = 4 * (k / 2) + k % 2;
      float v = s[e] + s[e + 2];
      v += __shfl_xor_sync(~0u, v, 4);
      v += __shfl_xor_sync(~0u, v, 8);
      v += __shfl_xor_sync(~0u, v, 16);
      sum[k] = v;
    }
    if (g == 0)
#pragma unroll
      for (int k = 0; k < 8; ++k) red_sum[warp * kPairs + col(k)] = sum[k];
    // Pᵀ as the value product's B operand: [pair][key] bf16, one 128-byte swizzled row per pair.
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int pair = col(2 * (e / 4) + (e % 2));
      const int key = 16 * warp + g + 8 * ((e % 4) / 2);
      *reinterpret_cast<uint16_t*>(p_tile + pair * 128 + (((key / 8) ^ (pair % 8)) << 4) + (key % 8) * 2) =
          static_cast<uint16_t>(pack_bf16x2(s[e], 0.f) & 0xffffu);
    }
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int e = 0; e < 16; ++e) o[mb][e] *= alpha[2 * (e / 4) + (e % 2)];
    fence_proxy_async_shared();
    named_barrier_sync(bar, 128);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float t = red_sum[col(k)];
#pragma unroll
      for (int w = 1; w < 4; ++w) t += red_sum[w * kPairs + col(k)];
      l_run[k] = l_run[k] * alpha[k] + t;
    }

    // Oᵀ[this warpgroup's dims] += Vᵀ · Pᵀ: V's 64-column blocks read transposed (M-major), 16 keys a step.
    wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk)
        wgmma_m64n32k16_ss<1>(o[mb],
                              wgmma_desc_128b(tile_addr + (4 * wg + mb) * kBlockBytes + kk * 16 * 128, kBlockBytes, 1024),
                              wgmma_desc_128b(p_addr + kk * 32, 16, 1024), 1);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) wgmma_pin(o[mb]);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty(slot));  // the tile is read
  }

  // Both warpgroups hold the same softmax state; each stages its normalised dims as [pair][dim] fp32 over q's
  // space and slot 0 (after the barrier: the other may still be reading q) for finish_splits.
  float* s_m = reinterpret_cast<float*>(smem + L::kStats);
  float* s_l = s_m + kPairs;
  float* s_out = reinterpret_cast<float*>(smem + L::kQ);
  named_barrier_sync(1, kConsumers);
  if (wg == 0 && warp == 0 && g == 0)
#pragma unroll
    for (int k = 0; k < 8; ++k) s_m[col(k)] = m_run[k], s_l[col(k)] = l_run[k];
  float inv[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) inv[k] = l_run[k] > 0.f ? 1.f / l_run[k] : 0.f;
#pragma unroll
  for (int mb = 0; mb < 4; ++mb)
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int k = 2 * (e / 4) + (e % 2);
      const int dim = 256 * wg + 64 * mb + 16 * warp + g + 8 * ((e % 4) / 2);
      s_out[col(k) * kOutStride + dim] = o[mb][e] * inv[k];
    }
  named_barrier_sync(1, kConsumers);
  mla_tc::finish_splits<kMerge, kConsumers>(p, s_out, s_l, s_m, n_pairs, pair_base, pairs, ctas, first_row, split,
                                            part_out, part_lse, sync,
                                            reinterpret_cast<float*>(smem + L::kSlots + L::kSlotBytes), ctid,
                                            [] { named_barrier_sync(1, kConsumers); });
#else
  __trap();  // sm_90a only; mla_decode_sm90_takes keeps other devices off this kernel
#endif
}

bool is_sm90() {
  static const bool yes = [] {
    int dev = 0, major = 0, minor = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
           minor == 0;
  }();
  return yes;
}

// The pool as a 2-d map (columns, token slots), boxes of 64 columns × min(page, 64) slots. The slot extent is not
// known here: the largest a coordinate can name, since every box the kernel asks for lies in a page of a block
// table. Encoded once per (pool, row width, box) — a captured graph keeps its copy of the map.
Status tensor_map_for(const MlaDecodeParams& p, int row, CUtensorMap* out) {
  struct Key {
    const void* cache;
    int row, box;
    bool operator==(const Key&) const = default;
  };
  struct Hash {
    size_t operator()(const Key& k) const { return std::hash<const void*>()(k.cache) ^ (size_t(k.row) << 1) ^ (size_t(k.box) << 12); }
  };
  static std::mutex mu;
  static std::unordered_map<Key, CUtensorMap, Hash> maps;
  const int box_rows = static_cast<int>(std::min<int64_t>(p.block_size, kKeys));
  const Key key{p.cache, row, box_rows};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = maps.find(key); it != maps.end()) {
    *out = it->second;
    return ok_status();
  }
  const uint64_t dims[2] = {static_cast<uint64_t>(row), uint64_t{1} << 31};
  const uint64_t strides[1] = {static_cast<uint64_t>(row)};
  const uint32_t box[2] = {64, static_cast<uint32_t>(box_rows)};
  KILN_RETURN_IF_ERROR(make_bf16_tensor_map_128b(out, p.cache, 2, dims, strides, box, "cuda::mla_decode_sm90: cache map"));
  if (maps.size() > 4096) maps.clear();  // pools come and go with models in long test processes
  maps.emplace(key, *out);
  return ok_status();
}

template <int kRope>
Status launch(const MlaDecodeParams& p, StreamHandle stream_handle) {
  using L = Layout<kRope>;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  CUtensorMap map;
  KILN_RETURN_IF_ERROR(tensor_map_for(p, L::kRow, &map));
  constexpr size_t kBytes = L::kAlloc;
  static const cudaError_t attr0 = cudaFuncSetAttribute(mla_decode_sm90_kernel<kRope, false>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  static const cudaError_t attr1 = cudaFuncSetAttribute(mla_decode_sm90_kernel<kRope, true>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  KILN_RETURN_IF_ERROR(check_cuda(attr0, "cuda::mla_decode_sm90: shared memory limit"));
  KILN_RETURN_IF_ERROR(check_cuda(attr1, "cuda::mla_decode_sm90: shared memory limit"));
  const int64_t rows = p.num_queries * p.num_heads;
  float* part_out = static_cast<float*>(p.workspace);
  float* part_lse = p.num_splits > 1 ? part_out + static_cast<int64_t>(p.num_splits) * rows * kMlaLatentDim : nullptr;
  const int64_t group_rows = p.row_groups ? p.max_group_rows : 1;
  const dim3 grid(static_cast<unsigned>(mla_decode_ctas_per_group(group_rows, p.num_heads)),
                  static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.row_groups ? p.num_groups : p.num_queries));
  const bool pdl = pdl_enabled();
  // The merge in the grid needs every CTA resident at once: one CTA per SM here.
  bool merged = false;
  if (p.sync != nullptr && p.num_splits >= kMlaKernelMergeMinSplits && grid.z <= kMlaSyncGroups &&
      !mla_tc::separate_merge_forced()) {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess)
      merged = static_cast<int64_t>(grid.x) * grid.y * grid.z <= sms;
  }
  const cudaError_t e =
      merged ? launch_with_pdl(mla_decode_sm90_kernel<kRope, true>, grid, dim3(kThreads), kBytes, stream, pdl, p, map,
                               part_out, part_lse, p.sync)
             : launch_with_pdl(mla_decode_sm90_kernel<kRope, false>, grid, dim3(kThreads), kBytes, stream, pdl, p, map,
                               part_out, part_lse, static_cast<unsigned*>(nullptr));
  KILN_RETURN_IF_ERROR(check_cuda(e, "cuda::mla_decode_sm90"));
  if (p.num_splits == 1 || merged) return ok_status();
  return check_cuda(launch_with_pdl(mla_tc::mla_decode_combine_kernel, dim3(static_cast<unsigned>(rows)),
                                    dim3(mla_tc::kCombineThreads), 0, stream, pdl, static_cast<const float*>(part_out),
                                    static_cast<const float*>(part_lse), rows, p.num_splits, p.out, p.out_bf16,
                                    p.out_lse),
                    "cuda::mla_decode_sm90: merge");
}

}  // namespace

bool mla_decode_sm90_takes(const MlaDecodeParams& p) {
  if (p.selected != nullptr || (p.rope_dim != kMlaRopeDim && p.rope_dim != 0)) return false;
  const int64_t bs = p.block_size;
  if (!(bs > 0 && (bs % kKeys == 0 || bs == 8 || bs == 16 || bs == 32))) return false;
  if (reinterpret_cast<uintptr_t>(p.cache) % 16 != 0) return false;
  return is_sm90();
}

Status mla_decode_sm90(const MlaDecodeParams& p, StreamHandle stream) {
  if (const char* why = mla_decode_check(p)) return invalid_argument(std::string("cuda::mla_decode_sm90: ") + why);
  if (!mla_decode_sm90_takes(p)) return invalid_argument("cuda::mla_decode_sm90: these parameters need the mma.sync kernel");
  if (p.num_queries == 0) return ok_status();
  return p.rope_dim == 0 ? launch<0>(p, stream) : launch<64>(p, stream);
}

}  // namespace kiln::cuda
