// The DFlash / DFlash2 drafter's own CUDA kernels (the projections run through the weight format's Linear objects).
// Raw pointers and sizes; every launch goes on `stream` and none waits for the host. Activations that feed a Linear
// are bf16 (what the dense CUDA format takes), everything else fp32, so each step mirrors the host model's
// arithmetic in dflash_model.cpp up to bf16 rounding of the linears' inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::dflash::cuda {

inline constexpr int kMaxTaps = 16;    // target layers one drafter may tap
inline constexpr int kMaxTopK = 64;    // candidates per draft row (selector_top_k, or v1's q width)
inline constexpr int kMaxHeadDim = 256;

struct TapPointers {
  const float* p[kMaxTaps];
};

// out[r, t·width + c] = bf16(taps.p[t][tap_rows[r] · width + c]): the fc input of each context row.
cudaError_t gather_taps(TapPointers taps, int num_taps, int64_t width, const int32_t* tap_rows, int64_t rows,
                        uint16_t* out, cudaStream_t stream);

// y[i] = rms_norm(x[src ? src[i] : i]) · w over d values; writes out_f32 and/or out_bf16 (either may be null).
cudaError_t rms_norm(const float* x, const int32_t* src_rows, const float* w, int64_t rows, int64_t d, double eps,
                     float* out_f32, uint16_t* out_bf16, cudaStream_t stream);

// Context rows' K/V: kv [rows, 2·kv_heads·head_dim] (k then v, fp32, straight from the stacked k/v projection) →
// k = RoPE(k_norm(k)) at positions[r], both encoded (bf16, or fp8 e4m3 when fp8) into cache slot slots[r].
cudaError_t write_context_kv(const float* kv, const float* k_norm, const int32_t* positions, const int64_t* slots,
                             int64_t rows, int kv_heads, int head_dim, double eps, double theta, bool fp8,
                             uint8_t* k_cache, uint8_t* v_cache, cudaStream_t stream);

// In place on qkv [rows, (heads + 2·kv_heads)·head_dim]: q = RoPE(q_norm(q)), k = RoPE(k_norm(k)) at positions[r].
cudaError_t norm_rope_qk(float* qkv, const float* q_norm, const float* k_norm, const int32_t* positions, int64_t rows,
                         int heads, int kv_heads, int head_dim, double eps, double theta, cudaStream_t stream);

// The query blocks' rows: row i sits at positions[i], local[i] rows into its block, which starts at row
// block_start[i], holds block_len[i] rows and belongs to drafting sequence seq[i], whose block table is
// tables + table_offset[seq] (pages of block_size rows).
struct BlockRows {
  const int32_t* positions;
  const int32_t* local;
  const int32_t* block_start;
  const int32_t* block_len;
  const int32_t* seq;
  const int32_t* tables;
  const int32_t* table_offset;
  int64_t block_size;
};

// attn[i, h·hd ..] (bf16) = softmax(q·Kᵀ / √hd) · V over the context keys in the cache (positions before the
// block's anchor that row i's window reaches) and the block's own keys (qkv's k, v of the block's rows; only
// j ≤ local[i] when causal). window 0: unbounded.
cudaError_t block_attention(const float* qkv, int64_t rows, BlockRows meta, int heads, int kv_heads, int head_dim,
                            const uint8_t* k_cache, const uint8_t* v_cache, bool fp8, int64_t window, bool causal,
                            uint16_t* attn, cudaStream_t stream);

// DFlash2's two-tap dynamic depthwise conv, one side: s[i, c] = Σ_{o ≤ local[i], o < taps} (base[side·taps + o, c]
// + d[i, (side·taps + o)·G + c / group]) · x[i − o, c], d [rows, 2·taps·G]. Writes s as bf16 to out_bf16, or adds
// it into residual (fp32).
cudaError_t dynamic_conv(const float* x, const float* d, const float* base, const int32_t* local, int64_t rows,
                         int64_t hidden, int taps, int64_t group, int side, uint16_t* out_bf16, float* residual,
                         cudaStream_t stream);

// h[i] = float(emb[i]) · scale.
cudaError_t embed_to_residual(const uint16_t* emb, int64_t n, float scale, float* h, cudaStream_t stream);

// act[r, c] = bf16(silu(gu[r, c]) · gu[r, inter + c]), gu [rows, 2·inter] fp32.
cudaError_t swiglu(const float* gu, int64_t rows, int64_t inter, uint16_t* act, cudaStream_t stream);

// Per row of logits [rows, vocab]: the k largest of logit · multiplier (then tanh(·/cap)·cap when cap > 0), largest
// first, ties to the lower id: ids [rows, k], values [rows, k].
cudaError_t top_k(const float* logits, int64_t rows, int64_t vocab, int k, double multiplier, double softcap,
                  int32_t* ids, float* values, cudaStream_t stream);

// The draft walk, one CTA per drafting sequence b (drafts first_row[b] .. + depth[b] − 1 of the top_k rows):
// row_j = U_j (+ Σ_r A[prev, r]·g[r]·B[cand_j, r] with a selector), greedy: the first maximum; temperature > 0:
// j drawn from softmax(row / T) with uniforms[first_row[b] + t], q written. prev starts at anchor[b].
struct WalkArgs {
  const int32_t* cand_ids;  // [rows, k]
  const float* cand_values;
  int k;
  const float* g;                 // [rows, rank] or null (no selector)
  const uint16_t* predecessor;    // [vocab, rank] bf16
  const uint16_t* successor;
  int64_t rank;
  const int32_t* first_row;       // [seqs]
  const int32_t* depth;
  const int32_t* anchor;
  const float* temperature;
  const double* uniforms;         // [rows]
  int32_t* tokens;                // [rows]
  int32_t* q_ids;                 // [rows, k] (written for sampled sequences)
  float* q_probs;
};
cudaError_t draft_walk(const WalkArgs& a, int64_t seqs, cudaStream_t stream);

}  // namespace kiln::dflash::cuda
