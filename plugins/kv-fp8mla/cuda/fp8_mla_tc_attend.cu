// The widened form of fp8_ds_mla's tensor-core attention (launch_tc_attend picks the direct one where it runs):
// fp8_ds_mla rows through the SDK's tensor-core MLA decode attention (kiln/cuda/mla_decode_tc.cuh): a tile of 64
// raw 656-byte (or NoPE 528-byte) rows is copied into shared memory with cp.async, two tiles in flight, and widened
// there to bf16 — e4m3 · its 128-value tile's scale in fp32 (exactly the CPU's decode_row value), then rounded to
// bf16 — so the cache is read once, in fp8, and never copied to bf16 in global memory.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "fp8_mla_direct_attend.h"
#include "fp8_mla_kernels.h"
#include "kiln/cuda/mla_decode_tc.cuh"

namespace kiln::fp8mla {
namespace {

template <int kRope>
struct Fp8Rows {
  static constexpr int kRopeDim = kRope;
  static constexpr int kLatent = static_cast<int>(cuda::kMlaLatentDim);
  static constexpr int kScalesOffset = kLatent;          // 4 fp32 scales, one per 128 latent values
  static constexpr int kRopeOffset = kLatent + 4 * 4;    // then the rope part in bf16
  static constexpr int kStagedRowBytes = (kRopeOffset + 2 * kRope + 15) / 16 * 16;  // 656 / 528: fp8_mla_row.h
  static constexpr int kChunks = kStagedRowBytes / 16;
  static constexpr int kTileRows = static_cast<int>(cuda::kMlaDecodeTile);

  __device__ static void copy_row(const void* cache, int64_t slot, uint16_t*, unsigned char* staged_row, int lane) {
    const unsigned char* pages = static_cast<const unsigned char*>(cache);
    const unsigned char* src = slot >= 0 ? pages + slot * kStagedRowBytes : pages;
#pragma unroll
    for (int k = 0; k < (kChunks + 31) / 32; ++k) {
      const int ch = lane + 32 * k;
      if (ch < kChunks) cuda::cp_async_16(staged_row + ch * 16, src + ch * 16, slot >= 0);
    }
  }

  // Two e4m3 values (low byte first) times the scale, as one bf16x2 register.
  __device__ static uint32_t widen_pair(uint32_t two_bytes, float scale) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    return cuda::pack_bf16x2(f.x * scale, f.y * scale);
  }

  // Thread i widens 16 latent values at a time (one 16-byte piece of a row), then copies rope pieces as they are.
  // A zero-filled (invisible) row has zero scales and widens to zeros.
  __device__ static void widen(const unsigned char* staged, uint16_t* tile, int row_stride, int tid, int threads) {
    constexpr int kLatentChunks = kLatent / 16;
    for (int i = tid; i < kTileRows * kLatentChunks; i += threads) {
      const int r = i / kLatentChunks, ch = i % kLatentChunks;
      const unsigned char* row = staged + r * kStagedRowBytes;
      const uint4 raw = *reinterpret_cast<const uint4*>(row + ch * 16);
      const float scale = reinterpret_cast<const float*>(row + kScalesOffset)[ch / 8];
      const uint4 lo = make_uint4(widen_pair(raw.x & 0xffffu, scale), widen_pair(raw.x >> 16, scale),
                                  widen_pair(raw.y & 0xffffu, scale), widen_pair(raw.y >> 16, scale));
      const uint4 hi = make_uint4(widen_pair(raw.z & 0xffffu, scale), widen_pair(raw.z >> 16, scale),
                                  widen_pair(raw.w & 0xffffu, scale), widen_pair(raw.w >> 16, scale));
      uint16_t* dst = tile + r * row_stride + ch * 16;
      *reinterpret_cast<uint4*>(dst) = lo;
      *reinterpret_cast<uint4*>(dst + 8) = hi;
    }
    if constexpr (kRope > 0) {
      constexpr int kRopeChunks = kRope * 2 / 16;
      for (int i = tid; i < kTileRows * kRopeChunks; i += threads) {
        const int r = i / kRopeChunks, ch = i % kRopeChunks;
        *reinterpret_cast<uint4*>(tile + r * row_stride + kLatent + ch * 8) =
            *reinterpret_cast<const uint4*>(staged + r * kStagedRowBytes + kRopeOffset + ch * 16);
      }
    }
  }
};

}  // namespace

bool tc_attend_supported(const RowShape& s, int64_t selected_width) {
  if (s.latent != cuda::kMlaLatentDim) return false;
  if (s.rope == 0) return true;
  // As the bf16 layout: the rope-64 rows take the tensor cores for dense attention.
  return s.rope == cuda::kMlaRopeDim && selected_width == 0;
}

const char* launch_tc_attend(const AttendParams& a, int num_splits, bool split_by_length, void* workspace,
                             void* stream, TcForm form) {
  if (!tc_attend_supported(a.shape, a.selected ? a.selected_width : 0)) return "the tensor-core attention needs latent 512";
  cuda::MlaDecodeParams p;
  p.rope_dim = a.shape.rope;
  p.q = a.q, p.num_queries = a.num_queries, p.num_heads = a.num_heads, p.cache = a.pages;
  p.block_size = a.block_size, p.block_tables = a.block_tables, p.max_blocks = a.max_blocks;
  p.query_seq = a.query_seq, p.kv_len = a.kv_len, p.selected = a.selected, p.selected_width = a.selected_width;
  p.scale = a.scale, p.out = a.out, p.out_bf16 = a.out_bf16, p.out_lse = a.out_lse;
  p.num_splits = num_splits, p.split_by_length = split_by_length, p.workspace = workspace, p.sync = a.sync;
  if (const char* why = cuda::mla_decode_check(p)) return why;
  const bool direct = direct_attend_takes(a.shape, a.block_size, p.selected ? p.selected_width : 0, a.pages);
  if (form == TcForm::kDirect && !direct)
    return "the direct form needs sm_90+, dense pages of 8, 16, 32 or a multiple of 64 slots, 16-byte aligned";
  if (direct && (form == TcForm::kDirect || (form == TcForm::kAuto && !direct_attend_forced_off())))
    return launch_direct_attend(p, stream);
  static const bool pdl = cuda::mla_decode_pdl_default();
  const cudaError_t e = cuda::launch_mla_decode_tc<Fp8Rows>(p, static_cast<cudaStream_t>(stream), pdl);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace kiln::fp8mla
