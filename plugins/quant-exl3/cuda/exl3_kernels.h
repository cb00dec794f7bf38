// The EXL3 CUDA kernels, as host-callable launches on raw device pointers (no CUDA types here, so the plugin's host
// code stays plain C++). A launch returns null or the CUDA error's text. All of them are graph-capturable: no
// allocation, no host synchronisation.
//
// The product y = (((x ⊙ suh)·Hb)·Ŵ)·Hb ⊙ svh (+ bias) runs in three launches:
//   1. rotate_input: xr = Hadamard128(x ⊙ suh), fp32, zero in the padding (the CPU reference's butterfly order, so
//      xr equals the CPU's bit for bit);
//   2. trellis_gemv: partial[split] = xr · Ŵ over one slice of the input tiles, Ŵ decoded in registers (each lane's
//      8 states are its mma B-fragment positions), fp32 FMAs in one fixed order per output;
//   3. finish_output: Σ over splits in order, Hadamard128, ⊙ svh, + bias, × a per-row weight, to bf16 or fp32.
// The split count depends on the matrix shape only, never on the row count, so every row's arithmetic is the same
// whatever shares the call (batch invariance for any number of rows).
//
// "Problems": a Linear's rows all use one trellis; an expert set's rows are (token, expert) pairs, each reading the
// trellis of its expert through a device table indexed by routing ids, so one launch serves every pair.
#pragma once

#include <cstdint>

namespace kiln::exl3::cuda {

constexpr int kHadamardSize = 128;
constexpr int kColumnTilesPerBlock = 4;  // one warp per 16-column output tile
constexpr int kMaxTilesPerSplit = 64;    // bounds the shared x slice (8 rows × 64 tiles × 16 × 4 B = 32 KiB)

// Where a problem's weights come from: `fixed` for every row, else table[ids[row / ids_div]] (one entry per
// expert). Same shape for every entry.
template <class T>
struct PerRow {
  const T* fixed = nullptr;
  const T* const* table = nullptr;
  const int32_t* ids = nullptr;
  int ids_div = 1;
};

struct RotateInputArgs {
  const uint16_t* x_bf16 = nullptr;  // [*, x_stride]: row q reads x row q / x_div
  int64_t x_stride = 0;
  int x_div = 1;
  int64_t rows = 0;
  int64_t in = 0, k_pad = 0;
  PerRow<float> suh;  // [k_pad]
  float hadamard_scale = 0.0f;
  float* xr = nullptr;  // [rows, k_pad]
};
const char* rotate_input(const RotateInputArgs& a, void* stream);

struct GemvArgs {
  PerRow<uint32_t> trellis;  // [k_pad/16, n_pad/16, 8·K] uint32 stream words
  int bits = 0;
  int codebook = 0;  // exl3::Codebook
  const float* xr = nullptr;  // [rows, k_pad]
  int64_t rows = 0;
  int64_t k_pad = 0, n_pad = 0;
  int splits = 1;
  float* partial = nullptr;  // [splits, rows, n_pad]
};
// rows_per_block (1, 4 or 8): how many rows one decode serves; expert pairs use 1 (each has its own trellis). A row's
// arithmetic is the same for every choice (its own accumulators, the same order), so the choice may follow the row
// count without breaking batch invariance.
const char* trellis_gemv(const GemvArgs& a, int rows_per_block, void* stream);
// The split count (and so the summation order) for a shape: enough blocks to fill `sm_count` SMs with one row.
int gemv_splits(int64_t k_pad, int64_t n_pad, int sm_count);

struct FinishArgs {
  const float* partial = nullptr;  // [splits, rows, n_pad]
  int splits = 1;
  int64_t rows = 0, n_pad = 0, out = 0;
  float hadamard_scale = 0.0f;
  PerRow<float> svh;             // [n_pad]
  const float* bias = nullptr;   // [out] or null
  const float* row_weight = nullptr;  // [rows] or null (routing weights)
  void* y = nullptr;             // row q at y + q·y_stride + col_offset
  bool y_bf16 = false;
  int64_t y_stride = 0, col_offset = 0;
  bool accumulate = false;
};
const char* finish_output(const FinishArgs& a, void* stream);

// SwiGLU of an expert pair's gate and up outputs (fp32 [pairs, inter] each), then rotated as the down projection's
// input: xr[p] = Hadamard128(silu(min(g, limit)) · clamp(u, −limit, limit) ⊙ suh_down[ids[p]]).
const char* swiglu_rotate(const float* gate, const float* up, int64_t pairs, int64_t inter, int64_t inter_pad,
                          float limit, PerRow<float> suh, float hadamard_scale, float* xr, void* stream);

// A dense bf16 part [out, in] of a mixed stack: y[q, col_offset + o] (+)= x[q]·w[o] (+ bias[o]), one warp per output,
// fixed order.
const char* dense_gemv(const uint16_t* x, int64_t rows, int64_t in, const uint16_t* w, int64_t out, const float* bias,
                       void* y, bool y_bf16, int64_t y_stride, int64_t col_offset, bool accumulate, void* stream);

// W [out, in] (HF orientation) = (diag(suh)·Hb·Ŵ·Hb·diag(svh))ᵀ cropped, into rows [row_offset, row_offset + out) of
// `dst` (row length `in`), fp32 or bf16: the CPU reference's operations in its order, so fp32 output is bitwise equal.
const char* dequantize(const uint32_t* trellis, int bits, int codebook, int64_t k_pad, int64_t n_pad, int64_t in,
                       int64_t out, const float* suh, const float* svh, float hadamard_scale, void* dst, bool dst_bf16,
                       int64_t row_offset, void* stream);
// A dense bf16 part's rows into the same kind of buffer.
const char* copy_dense_rows(const uint16_t* w, int64_t count, void* dst, bool dst_bf16, int64_t offset, void* stream);

// Only the decode: Ŵ [k_pad, n_pad] fp32 (tests hold it to the CPU's decode_matrix bit for bit).
const char* decode_matrix(const uint32_t* trellis, int bits, int codebook, int64_t k_pad, int64_t n_pad, float* w,
                          void* stream);

// Synthetic weights (model.load = "dummy"): uniformly random stream words, and ±scale with random signs.
const char* fill_random_words(uint32_t* words, int64_t count, uint64_t seed, void* stream);
const char* fill_random_signs(float* v, int64_t count, float scale, uint64_t seed, void* stream);

}  // namespace kiln::exl3::cuda
