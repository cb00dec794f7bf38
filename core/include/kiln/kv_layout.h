// KvLayout: how one layer's MLA cache is stored in its pages, and attention over those pages.
// Each token caches the normalised latent c (kv_lora_rank values) and the roped key part k_pe (qk_rope_head_dim).
// Pages hold block_size tokens; slot = block · block_size + offset. `bf16` is built in; `fp8_ds_mla` is a plugin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

struct KvGeometry {
  int64_t latent_dim = 0;  // kv_lora_rank
  int64_t rope_dim = 0;    // qk_rope_head_dim (0 for NoPE layers)
  int64_t block_size = 0;  // tokens per page
};

// Absorbed-form MLA attention for a batch of query rows, each belonging to one sequence.
// Scores s·(q_lat·c_t + q_rope·k_pe_t) over the visible tokens, softmax, output Σ p_t·c_t.
struct MlaAttendArgs {
  const void* cache = nullptr;           // this layer's pages
  int64_t num_queries = 0;
  int64_t num_heads = 0;
  const float* q = nullptr;              // [num_queries, num_heads, latent_dim + rope_dim]
  const int32_t* block_tables = nullptr; // [num_seqs, max_blocks]: page ids per sequence
  int64_t max_blocks = 0;
  const int32_t* query_seq = nullptr;    // [num_queries]: row of block_tables
  const int32_t* kv_len = nullptr;       // [num_queries]: tokens 0..kv_len-1 are visible (causal limit)
  const int32_t* selected = nullptr;     // [num_queries, selected_width] DSA top-k positions, -1 padded; null = all
  int64_t selected_width = 0;
  float scale = 1.0f;
  float* out = nullptr;                  // [num_queries, num_heads, latent_dim]
};

class KvLayout {
 public:
  static constexpr PluginKind kKind = PluginKind::kKvLayout;
  virtual ~KvLayout() = default;
  virtual KvGeometry geometry() const = 0;
  // Bytes one token occupies in one layer's cache (fp8_ds_mla: 656; bf16 with 512+64: 1152).
  virtual size_t bytes_per_token() const = 0;
  // Stores n tokens: latent [n, latent_dim], rope [n, rope_dim] (fp32) at the given slots.
  virtual Status write(void* cache, const int64_t* slots, int64_t n, const float* latent, const float* rope,
                       Stream stream) const = 0;
  // Reads n slots back as fp32 [n, latent_dim + rope_dim] (for prefill over cached context and for tests).
  virtual Status read(const void* cache, const int64_t* slots, int64_t n, float* out, Stream stream) const = 0;
  virtual Status attend(const MlaAttendArgs& args, Stream stream) const = 0;
};

}  // namespace kiln
