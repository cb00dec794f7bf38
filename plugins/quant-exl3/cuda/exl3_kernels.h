// The EXL3 CUDA kernels, as host-callable launches on raw device pointers (no CUDA types here, so the plugin's host
// code stays plain C++). A launch returns null or the CUDA error's text. All of them are graph-capturable: no
// allocation, no host synchronisation.
//
// The product y = (((x ⊙ suh)·Hb)·Ŵ)·Hb ⊙ svh (+ bias) is one launch (trellis_product). Its grid is (split of the
// input blocks, 128-column group, row block), and the splits of a (column group, row block) form one thread-block
// cluster (Hopper), so split sums meet in distributed shared memory instead of global memory. A block
//   1. issues its first trellis copies, then rotates its slice of the input, one warp per (row, 128-block): x ⊙ suh
//      (or the SwiGLU of an expert's gate and up outputs ⊙ suh), 128-point fp32 butterflies across the lanes in the
//      CPU reference's order (so the rotated input equals the CPU's bit for bit), then each value split into fp16
//      hi + lo parts (hi + lo = x to about 2^-22);
//   2. streams its tiles (one warp per 16-column tile, 16 tiles in flight through a shared-memory ring filled by
//      cp.async, the first ones requested before the wait on the previous kernel: a Linear's always, an expert set's
//      where ProductArgs::routing_before_wait allows), decodes Ŵ in registers straight into mma.m16n8k16 B fragments
//      (each lane's 8 states are its fragment positions, cut from three stream words, two at K = 4) and multiplies on
//      the tensor cores with fp32 accumulators:
//      A rows 0..7 are the block's rows' hi parts, rows 8..15 their lo parts, so a row's sum is its two C rows
//      added and the product keeps fp32 accuracy at no extra tensor-core work;
//   3. after a cluster barrier, one warp per row sums the cluster's splits in split order, rotates the 128
//      outputs, applies ⊙ svh, + bias, × a per-row weight, and stores bf16 or fp32 (or adds).
// The split count depends on the matrix shape only, and the tensor cores compute each row of A independently, so
// each row's arithmetic is the same whatever shares the call (batch invariance for any number of rows). Rotated
// inputs beyond ±65504 are clamped there (fp16's range; activations after the 1/√128-scaled rotation stay far
// below it in the models served).
//
// "Problems": a Linear's rows all use one trellis; an expert set's rows are (token, expert) pairs, each reading the
// trellis and scales of its expert through device tables indexed by routing ids, so one launch serves every pair.
#pragma once

#include <cstdint>

namespace kiln::exl3::cuda {

constexpr int kHadamardSize = 128;
// The splits of one column group form one thread-block cluster of at most 8 (portable) blocks. Measured on the H200
// (2026-12-02): non-portable clusters of 16 were slower at every expert shape (fewer co-resident clusters).
constexpr int kMaxSplits = 8;
constexpr int kMaxRowsPerBlock = 8;   // A rows 0..7 hi parts, 8..15 lo parts
constexpr int64_t kMaxPassRows = 64;  // rows per launch (callers run more rows in passes)

// Where a row's weights come from: `fixed` for every row, else table[ids[row / ids_div]] (one entry per expert).
template <class T>
struct PerRow {
  const T* fixed = nullptr;
  const T* const* table = nullptr;
  const int32_t* ids = nullptr;
  int ids_div = 1;
};

// One output of a launch: a module (or, for an expert set, one projection's modules through routing ids) and
// where its columns go. A launch's parts share the input, K, codebook and k_pad; its blocks run them side by side.
struct ProductPart {
  PerRow<uint32_t> trellis;  // [k_pad/16, n_pad/16, 8·K] uint32 stream words
  PerRow<float> suh;         // [k_pad]
  PerRow<float> svh;         // [n_pad]
  const float* bias = nullptr;  // [out] or null
  int64_t n_pad = 0, out = 0;
  // Global row q's outputs at y + q·y_stride + col_offset.
  void* y = nullptr;
  int64_t y_stride = 0, col_offset = 0;
};
constexpr int kMaxParts = 4;

struct ProductArgs {
  int64_t row_begin = 0, rows = 0;  // this launch's rows (global row q = row_begin + local row), rows ≤ kMaxPassRows
  // Input, one of: bf16 x (global row q reads x row q / x_div) or, with `gate`, the SwiGLU of gate and up [*, in].
  const uint16_t* x_bf16 = nullptr;
  int64_t x_stride = 0;
  int x_div = 1;
  const float* gate = nullptr;
  const float* up = nullptr;
  float swiglu_limit = 0.0f;
  int64_t in = 0;
  int bits = 0, codebook = 0;  // codebook: exl3::Codebook's order
  int64_t k_pad = 0;
  int splits = 1;  // product_splits(k_pad)
  float hadamard_scale = 0.0f;
  int parts = 1;  // 1 .. kMaxParts
  ProductPart part[kMaxParts];
  const float* row_weight = nullptr;  // [global rows] or null (routing weights)
  bool y_bf16 = false;
  bool accumulate = false;
  // The routing (ids, row weights) was written at least two kernels back on the stream and the kernel just before
  // this one read it after its own pdl_wait (an expert set's down launch after its gate/up launch): then this launch
  // may follow the routing to its trellis, scales and row weights before its pdl_wait — by the time any of its blocks
  // runs, the kernel before it has passed its wait, so the routing's writer has completed (pdl.cuh's order). The
  // inputs (gate and up outputs) are still read after the wait.
  bool routing_before_wait = false;
};
// rows_per_block (1, 4 or 8): how many rows one decode serves; a row's arithmetic is the same for every choice.
const char* trellis_product(const ProductArgs& a, int rows_per_block, void* stream);
// The split count (so the summation order) for a shape: one per 128-input block up to a cluster of kMaxSplits.
int product_splits(int64_t k_pad);
// The split count of an expert set's projections: a launch serves many (token, expert) pairs, so its grid is large
// already and fewer, longer splits amortise each warp's set-up (still a function of the shape only).
int expert_splits(int64_t k_pad);

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
