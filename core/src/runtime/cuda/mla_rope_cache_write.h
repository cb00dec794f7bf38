// The step between MLA's projections and its query absorption, as one kernel: RoPE on the queries' and the
// latent's rope slices, the latent cache write, and the two forms the absorbed attention reads the queries in.
// Internal to runtime/cuda.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// For n tokens of `heads` query heads (q fp32 [n, heads, nope + rope]) and their latents (ckv fp32
// [n, latent + rope], rows ckv_stride apart), with D = latent + rope:
//   q[t, h, nope:] and ckv[t, latent:] roped in place (apply_rope_interleaved_f32 at positions[t]);
//   cache[slots[t], :] written as mla_write_cache (bf16 RMSNorm'd latent · norm_weight, bf16 k_pe);
//   q_bf[t, h, :] = bf16(q[t, h, :]) (f32_to_bf16) and q_abs[t, h, latent:] = q[t, h, nope:] (the rope part of
//   the absorbed query; the latent part is the absorption GEMM's).
// The same arithmetic as those kernels run one after another, in one launch. rope even and ≤ 128 (0: no RoPE).
// heads = 0: no queries (q, q_bf, q_abs unused). positions == null: no RoPE (the rows' rope parts are final).
// norm_weight == null: the latent is stored as given (already normalised). A negative slot stores nothing.
// cache == null: nothing is stored; the rows are finished in place (normalised in fp32, roped) for a KvLayout that
// appends final rows.
struct MlaRopeCacheWrite {
  float* q = nullptr;
  float* ckv = nullptr;
  int64_t ckv_stride = 0;  // floats between ckv rows; 0: D (packed)
  int64_t n = 0, heads = 0, nope = 0, rope = 0, latent = 0;
  const int64_t* positions = nullptr;
  const float* inv_freq = nullptr;  // device [rope / 2]
  float attention_factor = 1.0f;
  const uint16_t* norm_weight = nullptr;  // kv_a_layernorm, bf16 [latent]
  float eps = 0.0f;
  const int64_t* slots = nullptr;
  uint16_t* cache = nullptr;  // bf16 [slots, D]
  uint16_t* q_bf = nullptr;   // bf16 [n, heads, nope + rope]
  // fp32 [n, heads, D]. Null: the queries are wanted in bf16 only (q_bf; kKvFuseQueriesBf16Only), q's contents are
  // unspecified after.
  float* q_abs = nullptr;
};
Status mla_rope_cache_write(const MlaRopeCacheWrite& a, StreamHandle stream);

}  // namespace kiln::cuda
