// The small kernels the CUDA model runner needs between the tested building blocks of kernels/cuda: dummy
// weights made on the device, dtype casts, the MLA cache write, and an MLA attention for latent / rope widths
// the tensor-core decode kernel does not take (it is built for 512 + 64).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/indexer_key_format.h"
#include "kiln/status.h"

namespace kiln::cuda {

// p[i] = bf16(uniform in [−bound, bound)), a counter-based hash of (seed, i): the same seed gives the same weights.
Status fill_uniform_bf16(uint16_t* p, size_t n, float bound, uint64_t seed, StreamHandle stream);
Status fill_uniform_f32(float* p, size_t n, float bound, uint64_t seed, StreamHandle stream);
Status fill_constant_bf16(uint16_t* p, size_t n, float value, StreamHandle stream);
Status fill_constant_f32(float* p, size_t n, float value, StreamHandle stream);

Status f32_to_bf16(const float* in, size_t n, uint16_t* out, StreamHandle stream);
Status bf16_to_f32(const uint16_t* in, size_t n, float* out, StreamHandle stream);

// out[i] = ids[i] − offset for n ids: token or expert ids moved into a tensor-parallel rank's numbering (those it
// does not own fall outside [0, its count), which the embedding gather and the expert grouping skip).
Status offset_ids_i32(const int32_t* ids, int64_t n, int32_t offset, int32_t* out, StreamHandle stream);

// W_UK of every head transposed, for the skinny absorption GEMM (its weight rows must be contiguous in k):
// w_uk_t[h, l, i] = kv_b[h·(nope + v) + i, l] for kv_b bf16 [heads·(nope + v), latent], w_uk_t bf16
// [heads, latent, nope].
Status mla_transpose_w_uk(const uint16_t* kv_b, int64_t heads, int64_t nope, int64_t v, int64_t latent,
                          uint16_t* w_uk_t, StreamHandle stream);

// For each of n tokens: cache[slots[t], 0:L] = bf16(rmsnorm(ckv[t, 0:L]) · norm_weight) and
// cache[slots[t], L:L+R] = bf16(ckv[t, L:L+R]) (k_pe, already roped). ckv fp32 [n, L + R]; cache bf16 [slots, L + R].
Status mla_write_cache(const float* ckv, int64_t n, int64_t latent_dim, int64_t rope_dim, const uint16_t* norm_weight,
                       float eps, const int64_t* slots, uint16_t* cache, StreamHandle stream);

// Plain (CUDA-core, fp32) absorbed MLA attention over the paged bf16 cache, any latent / rope width: for query
// row r and head h, out[r, h, :] = softmax_t(scale · q[r, h, :]·cache[t, :]) · cache[t, 0:L] over t < kv_len[r].
// q fp32 [rows, heads, L + R], out fp32 [rows, heads, L]; scores is fp32 scratch [rows · heads · max_kv_len].
// With `selected` (DSA), t runs over selected[r, 0:selected_width] instead, skipping entries outside
// [0, kv_len[r]) (−1 padding); then max_kv_len ≥ selected_width.
struct MlaReferenceParams {
  const float* q = nullptr;
  int64_t rows = 0, heads = 0, latent_dim = 0, rope_dim = 0;
  const uint16_t* cache = nullptr;
  int64_t block_size = 0;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks = 0;
  const int32_t* query_seq = nullptr;
  const int32_t* kv_len = nullptr;
  int64_t max_kv_len = 0;
  const int32_t* selected = nullptr;
  int64_t selected_width = 0;
  float scale = 1.0f;
  float* scores = nullptr;
  float* out = nullptr;
  float* lse = nullptr;  // optional [rows, heads]: log-sum-exp of the scaled scores (−inf where no key is visible)
};
Status mla_attention_reference(const MlaReferenceParams& p, StreamHandle stream);

// out = LayerNorm(x) · weight + bias over [n, dim] fp32 rows (two-pass mean / variance, as cpu::layernorm).
Status layernorm_f32(const float* x, const float* weight, const float* bias, int64_t n, int64_t dim, float eps,
                     float* out, StreamHandle stream);

// cache[slots[t], :] = x[t, :] for n rows of `dim` fp32 values (the DSA indexer's key cache write).
Status scatter_rows_f32(const float* x, int64_t n, int64_t dim, const int64_t* slots, float* cache, StreamHandle stream);

// The DSA lightning indexer's scores over a paged key cache, for batched rows of several sequences:
// scores[r, t] = Σ_h (w[r, h] · head_scale) · ReLU(scale · q[r, h, :]·key(t)) for t < kv_len[r], −inf for
// kv_len[r] ≤ t < width (cpu::dsa_indexer_scores per row). q fp32 [rows, heads, dim] (after RoPE), w fp32
// [rows, heads], keys [slots, row] addressed through block_tables[query_seq[r]]; heads · dim ≤ 8192. Rows in
// key_format: fp32 [dim], or fp8 [dim + 4] read as cpu::dsa_indexer_scores_fp8 reads them (the logit
// (q · codes) · key scale · scale), the codes widened in registers: no fp32 copy of the cache.
struct DsaIndexerParams {
  const float* q = nullptr;
  const float* w = nullptr;
  int64_t rows = 0, heads = 0, dim = 0;
  float scale = 1.0f, head_scale = 1.0f;
  const void* keys = nullptr;
  IndexerKeyFormat key_format = IndexerKeyFormat::kFp32;
  int64_t block_size = 0;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks = 0;
  const int32_t* query_seq = nullptr;
  const int32_t* kv_len = nullptr;
  int64_t width = 0;
  float* scores = nullptr;
};
Status dsa_indexer_scores_paged(const DsaIndexerParams& p, StreamHandle stream);

}  // namespace kiln::cuda
