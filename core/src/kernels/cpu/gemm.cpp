#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/half_float.h"
#include "kernels/cpu/simd.h"

// The vector helpers are always inlined into the cloned kernels; their by-value ABI never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kiln::cpu {
namespace {

// Tokens processed per pass over the weights: every weight row is read once per block while the block's
// activations (kTokenBlock · in · 4 bytes) stay in cache.
constexpr int64_t kTokenBlock = 64;
// Below this many multiply-adds per block, thread start-up costs more than it saves.
constexpr int64_t kParallelMacs = 1 << 15;

template <class WeightT>
KILN_INLINE simd::F32x16 load_weights(const WeightT* w) {
  if constexpr (sizeof(WeightT) == 2) {
    return simd::load_bf16(w);
  } else {
    return simd::load(w);
  }
}

template <class WeightT>
KILN_INLINE float widen(WeightT w) {
  if constexpr (sizeof(WeightT) == 2) {
    return bf16_to_float(w);
  } else {
    return w;
  }
}

// Register tile: kRows weight rows × kTokens tokens of accumulators, so each weight vector load feeds
// kTokens FMAs and each activation load kRows FMAs.
constexpr int kTokens = 4;

// y[t · ldy + r] = w_r · x_t for the R weight rows starting at w (row stride `in`) and the `rows`
// activation rows of the block.
template <int R, class WeightT>
KILN_INLINE void tile_dots(const WeightT* w, const float* x, int64_t rows, int64_t in, float* y, int64_t ldy) {
  using simd::F32x16;
  using simd::kLanes;
  const int64_t vec_end = in - in % kLanes;
  int64_t t = 0;
  for (; t + kTokens <= rows; t += kTokens) {
    F32x16 acc[R][kTokens] = {};
    for (int64_t k = 0; k < vec_end; k += kLanes) {
      F32x16 xv[kTokens];
#pragma GCC unroll 4
      for (int j = 0; j < kTokens; ++j) xv[j] = simd::load(x + (t + j) * in + k);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const F32x16 wv = load_weights(w + r * in + k);
#pragma GCC unroll 4
        for (int j = 0; j < kTokens; ++j) acc[r][j] += wv * xv[j];
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < kTokens; ++j) {
        float s = simd::reduce_add(acc[r][j]);
        for (int64_t k = vec_end; k < in; ++k) s += widen(w[r * in + k]) * x[(t + j) * in + k];
        y[(t + j) * ldy + r] = s;
      }
    }
  }
  for (; t < rows; ++t) {
    const float* xt = x + t * in;
    F32x16 acc[R] = {};
    for (int64_t k = 0; k < vec_end; k += kLanes) {
      const F32x16 xv = simd::load(xt + k);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r] += load_weights(w + r * in + k) * xv;
    }
    for (int r = 0; r < R; ++r) {
      float s = simd::reduce_add(acc[r]);
      for (int64_t k = vec_end; k < in; ++k) s += widen(w[r * in + k]) * xt[k];
      y[t * ldy + r] = s;
    }
  }
}

constexpr int kRows = 4;

// Output rows [o_begin, o_end) of one token block.
template <class WeightT>
KILN_INLINE void block_rows(const WeightT* w, const float* x, int64_t rows, int64_t in, int64_t o_begin,
                            int64_t o_end, float* y, int64_t ldy) {
  int64_t o = o_begin;
  for (; o + kRows <= o_end; o += kRows) tile_dots<kRows>(w + o * in, x, rows, in, y + o, ldy);
  for (; o < o_end; ++o) tile_dots<1>(w + o * in, x, rows, in, y + o, ldy);
}

using BlockRowsF32 = void (*)(const float*, const float*, int64_t, int64_t, int64_t, int64_t, float*, int64_t);
using BlockRowsBf16 = void (*)(const uint16_t*, const float*, int64_t, int64_t, int64_t, int64_t, float*, int64_t);

#define KILN_GEMM_VARIANT(suffix, attribute)                                                                      \
  attribute void block_rows_f32_##suffix(const float* w, const float* x, int64_t rows, int64_t in, int64_t o0,  \
                                         int64_t o1, float* y, int64_t ldy) {                                   \
    block_rows(w, x, rows, in, o0, o1, y, ldy);                                                                  \
  }                                                                                                              \
  attribute void block_rows_bf16_##suffix(const uint16_t* w, const float* x, int64_t rows, int64_t in,          \
                                          int64_t o0, int64_t o1, float* y, int64_t ldy) {                      \
    block_rows(w, x, rows, in, o0, o1, y, ldy);                                                                  \
  }
KILN_GEMM_VARIANT(base, )
KILN_GEMM_VARIANT(avx2, KILN_TARGET_AVX2)
KILN_GEMM_VARIANT(avx512, KILN_TARGET_AVX512)
#undef KILN_GEMM_VARIANT

const BlockRowsF32 block_rows_f32 = simd::pick_isa<BlockRowsF32>(block_rows_f32_base, block_rows_f32_avx2,
                                                                 block_rows_f32_avx512);
const BlockRowsBf16 block_rows_bf16 = simd::pick_isa<BlockRowsBf16>(block_rows_bf16_base, block_rows_bf16_avx2,
                                                                    block_rows_bf16_avx512);

// Splits the output rows of one token block over the threads, in multiples of kRows.
template <class Fn>
void for_row_ranges(int64_t rows, int64_t in, int64_t out, Fn&& fn) {
  const int64_t groups = (out + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (rows * in * out >= kParallelMacs)
  for (int64_t g = 0; g < groups; ++g) fn(g * kRows, std::min(out, (g + 1) * kRows));
}

}  // namespace

void gemm_f32(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y) {
  for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
    const int64_t rows = std::min(kTokenBlock, n - t0);
    for_row_ranges(rows, in, out, [&](int64_t o0, int64_t o1) {
      block_rows_f32(w, x + t0 * in, rows, in, o0, o1, y + t0 * out, out);
    });
  }
}

void gemm_bf16(const float* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, float* y) {
  for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
    const int64_t rows = std::min(kTokenBlock, n - t0);
    for_row_ranges(rows, in, out, [&](int64_t o0, int64_t o1) {
      block_rows_bf16(w, x + t0 * in, rows, in, o0, o1, y + t0 * out, out);
    });
  }
}

void gemm_f16(const float* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, float* y) {
  // fp16 has no shift-only widening: each group of kRows rows is converted once per token block.
  for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
    const int64_t rows = std::min(kTokenBlock, n - t0);
    for_row_ranges(rows, in, out, [&](int64_t o0, int64_t o1) {
      thread_local std::vector<float> wide;
      wide.resize(static_cast<size_t>((o1 - o0) * in));
      fp16_to_float(w + o0 * in, wide.data(), (o1 - o0) * in);
      block_rows_f32(wide.data(), x + t0 * in, rows, in, 0, o1 - o0, y + t0 * out + o0, out);
    });
  }
}

Status gemm(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out, float* y) {
  switch (w_dtype) {
    case DType::kF32: gemm_f32(x, n, in, static_cast<const float*>(w), out, y); return ok_status();
    case DType::kBF16: gemm_bf16(x, n, in, static_cast<const uint16_t*>(w), out, y); return ok_status();
    case DType::kF16: gemm_f16(x, n, in, static_cast<const uint16_t*>(w), out, y); return ok_status();
    default:
      return invalid_argument(std::string("gemm: weight dtype ") + dtype_name(w_dtype) +
                              " is not supported (expected F32, BF16 or F16)");
  }
}

}  // namespace kiln::cpu
