// The MLA prefill's kv_b expansion on Hopper in one launch: for every gathered key and every head h,
//   out[h][key][0 .. head_width) = bf16(latent[key][0 .. latent_dim) · kv_b[h]ᵀ)      (K_nope | V, head-major)
// as one GEMM over all heads' kv_b rows (n = h · head_width + c). Each output value is one fp32 sum over the latent
// in a fixed order (64-wide k tiles, k16 tensor-core steps, no split), computed the same way wherever its row and
// column fall in the grid — so a value does not depend on how many heads the call covers (a tensor-parallel rank
// expands only its heads and must get the one-rank bits) nor on how many keys it covers (chunked prefill expands a
// cached key again with every chunk, and would get the same bits each time). cuBLAS gives neither over all heads: it
// picks its kernel, and with it the summation order, by the problem's width and height — which is why the path's
// default is head_batched_gemm.h's cuBLASLt launch (its algorithm chosen per one-head problem: bits independent of the
// head count, not of the key count), 2.2× faster than this kernel at 4K keys on an H100 (61 vs 134 µs).
//
// Tiles of 128 keys × 256 kv_b rows on persistent CTAs (one per SM): one producer thread streams both operands by TMA
// into a four-deep ring of 128-byte-swizzled tiles (the latent rows through a strided tensor map, so the rope tail is
// never read), running on into the next tile while two consumer warpgroups finish and store the current one
// (m64n256k16 products). Keys past the end and kv_b rows past the last head arrive as zeros and are not stored.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// Whether the Hopper expansion can run these operands: the current device is compute capability 9.0 (sm_90a code),
// latent_dim and row_width are multiples of 8 (TMA strides), head_width is even (a stored pair never straddles two
// heads) and the three pointers are 16-byte aligned.
bool mla_kv_expand_sm90_supported(int64_t latent_dim, int64_t row_width, int64_t head_width, const void* latent,
                                  const void* kv_b, const void* out);

// Whether mla_prefill_attention uses it: supported, and the environment sets KILN_MLA_KV_EXPAND=sm90. Opt-in because
// it measured slower than the head-batched cuBLASLt launch (above) and than the per-head cuBLAS calls before it (H100, GLM-4.7-Flash's 20 heads: 151 µs for 4,096 keys against
// ≈ 112 µs for the 20 calls inside the model; 1,073 vs 598 µs for 32,768 keys; whole-model prefill equal at 4K, −2 % at
// 32K). It holds ≈ 35 % of the tensor rate at every key count, in a first form with one CTA per tile as in this
// persistent one, so the ring's fill is not what limits it (bench/RESULTS.md, 2026-12-07).
bool mla_kv_expand_sm90_applies(int64_t latent_dim, int64_t row_width, int64_t head_width, const void* latent,
                                const void* kv_b, const void* out);

// latent: bf16 [keys][row_width], the first latent_dim values of a row multiplied; kv_b: bf16 [heads · head_width]
// [latent_dim]; out: bf16 [heads][keys][head_width].
Status mla_kv_expand_sm90(const uint16_t* latent, int64_t keys, int64_t row_width, int64_t latent_dim,
                          const uint16_t* kv_b, int64_t heads, int64_t head_width, uint16_t* out, StreamHandle stream);

}  // namespace kiln::cuda
