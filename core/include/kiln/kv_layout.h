// KvLayout: how one layer's MLA cache is stored in its pages — a codec with attention over its own pages.
// Each token caches the normalised latent c (latent_dim values) and the roped key part k_pe (rope_dim values;
// 0 for NoPE layers). Pages hold block_size tokens; slot = block · block_size + offset. `bf16` is built in
// (CPU and CUDA); `fp8_ds_mla` is a plugin.
//
// A step uses a layout in three ways (device pointers on CUDA, host pointers on the CPU):
//   append  — store the step's new tokens (quantize on write);
//   attend  — absorbed-form attention of query rows over the pages (decode, speculative verification, short
//             chunks, DSA-selected rows), split-KV on CUDA as planned by plan_attend;
//   gather  — rows back as plain values (bf16 on CUDA, fp32 on the CPU) for prefill attention over cached + new
//             rows in expanded form (the core expands K/V from them and runs its tensor-core prefill kernel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kiln/indexer_key_format.h"
#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

struct KvGeometry {
  int64_t latent_dim = 0;  // kv_lora_rank
  int64_t rope_dim = 0;    // qk_rope_head_dim (0 for NoPE layers)
  int64_t block_size = 0;  // tokens per page
};

// What append() may do beyond storing final rows, so the MLA step between the projections and attention is one
// launch. A layout declares what it fuses (append_fusions()); the core does the rest itself beforehand.
enum KvAppendFusion : uint32_t {
  // The row prologue: latent ← RMSNorm(latent) · norm_weight, rope part ← RoPE at the token's position.
  kKvFuseNormRope = 1u << 0,
  // The queries of the same tokens finished in the same launch (requires kKvFuseNormRope): see KvAppendArgs::q.
  kKvFuseQueries = 1u << 1,
  // (ABI 2.8) With kKvFuseQueries: the layout takes q_abs null — the caller then reads the queries in bf16 only (a
  // step attending in the expanded prefill form alone) and the layout writes q_bf alone, not the fp32 forms (a third
  // of a 4K prefill chunk's append bytes). Layouts built before 2.8 never return it, so they never see q_abs null.
  kKvFuseQueriesBf16Only = 1u << 2,
};

struct KvAppendArgs {
  void* pages = nullptr;           // this layer's pages
  const int64_t* slots = nullptr;  // [n]; a negative slot stores nothing (padding)
  int64_t n = 0;
  // Row t: latent_dim latent values, then rope_dim rope values, fp32, rows `row_stride` floats apart (0: packed).
  // Final (normalised, roped) unless the prologue below is set; the prologue works in place.
  float* rows = nullptr;
  int64_t row_stride = 0;
  // Prologue (only with kKvFuseNormRope; null norm_weight: the rows are final). RMSNorm over the latent with a bf16
  // weight and `eps`; RoPE over interleaved pairs of the rope part at positions[t] with inv_freq [rope_dim / 2]
  // and cos/sin scaled by rope_factor.
  const uint16_t* norm_weight = nullptr;
  float eps = 0.0f;
  const int64_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float rope_factor = 1.0f;
  // Queries (only with kKvFuseQueries; null q: none). q fp32 [n, heads, nope + rope_dim] gets RoPE on its rope part
  // in place, q_bf = bf16(q) (what the absorption reads), and q_abs[t, h, latent_dim:] = the roped rope part
  // (the tail of the absorbed query; its head is the absorption's output). q_abs rows are heads · (latent + rope).
  // q_abs null (only to a layout with kKvFuseQueriesBf16Only): q_bf alone; q's contents are unspecified after.
  float* q = nullptr;
  int64_t heads = 0, nope = 0;
  uint16_t* q_bf = nullptr;
  float* q_abs = nullptr;
};

// Absorbed-form MLA attention for a batch of query rows, each belonging to one sequence:
// out[r, h] = Σ_t softmax_t(scale · (q_lat·c_t + q_rope·k_pe_t)) · c_t over the visible tokens.
struct MlaAttendArgs {
  const void* cache = nullptr;            // this layer's pages
  int64_t num_queries = 0;
  int64_t num_heads = 0;
  const float* q = nullptr;               // [num_queries, num_heads, latent_dim + rope_dim]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks]: page ids per sequence
  int64_t max_blocks = 0;
  const int32_t* query_seq = nullptr;     // [num_queries]: row of block_tables
  const int32_t* kv_len = nullptr;        // [num_queries]: tokens 0..kv_len-1 are visible (causal limit)
  const int32_t* selected = nullptr;      // [num_queries, selected_width] DSA positions, −1 padded; null = all
  int64_t selected_width = 0;
  float scale = 1.0f;
  float* out = nullptr;                   // [num_queries, num_heads, latent_dim] fp32 (may be null with out_bf16)
  uint16_t* out_bf16 = nullptr;           // CUDA, optional: the same values rounded to bf16
  // CUDA, optional (ABI 2.7): [num_queries, num_heads] each (query, head)'s log-sum-exp of its scaled scores,
  // natural log, −inf where no key is visible (out is then 0). Decode-context parallelism merges the partial
  // results of ranks that each attend over their own tokens with it. CPU layouts refuse it (CPU ranks merge
  // through kernels/cpu/mla_partial_attention).
  float* out_lse = nullptr;
  // CUDA: the shape plan_attend was asked for (max_kv_len ≥ every kv_len), what it returned, and its workspace on
  // the device.
  int64_t max_kv_len = 0;
  int num_splits = 1;
  bool split_by_length = false;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// The shape of an attend() call, known before the step's buffers are carved.
struct MlaAttendShape {
  int64_t num_queries = 0;
  int64_t num_heads = 0;
  int64_t max_kv_len = 0;         // the longest kv_len among the rows
  int64_t selected_width = 0;     // > 0: rows attend through a DSA selection of this width
  bool batch_invariant = false;   // each row's result must not depend on the other rows (speculative verification)
  int multiprocessor_count = 0;
};

// What attend will launch for a shape. Runners capture decode steps into CUDA graphs and replay a graph for a later
// step whose plan compares equal, with the earlier step's kernel arguments: so everything attend derives from the
// shape (a grid, a score-row stride, a kernel choice) must show in the plan; `launch_key` carries what the other
// fields do not (0 when nothing does).
struct MlaAttendPlan {
  int num_splits = 1;
  bool split_by_length = false;
  size_t workspace_bytes = 0;
  int64_t launch_key = 0;
  bool operator==(const MlaAttendPlan&) const = default;
};

// Rows of sequences, positions 0 .. kv_len − 1 of each, gathered into one array: sequence b's position t goes to
// row key_start + t. (The layout of the prefill path's key table.)
struct KvGatherSeq {
  int32_t table_row = 0;  // its row of block_tables
  int32_t key_start = 0;
  int32_t kv_len = 0;
  int32_t reserved = 0;
};

struct KvGatherArgs {
  const void* pages = nullptr;
  const int32_t* block_tables = nullptr;  // [rows, max_blocks]
  int64_t max_blocks = 0;
  const KvGatherSeq* seqs = nullptr;      // [num_seqs]
  int64_t num_seqs = 0;
  int64_t max_kv_len = 0;                 // ≥ every kv_len (sizes the grid)
  void* out = nullptr;                    // [Σ kv_len, latent_dim + rope_dim]: bf16 on CUDA, fp32 on the CPU
};

class KvLayout {
 public:
  static constexpr PluginKind kKind = PluginKind::kKvLayout;
  virtual ~KvLayout() = default;
  virtual KvGeometry geometry() const = 0;
  // Bytes one token occupies in one layer's cache (fp8_ds_mla: 656; bf16 with 512 + 64: 1152).
  virtual size_t bytes_per_token() const = 0;
  virtual Device device() const = 0;
  // KvAppendFusion bits append() implements (CUDA); 0 = it stores final rows only.
  virtual uint32_t append_fusions() const { return 0; }
  virtual Status append(const KvAppendArgs& args, Stream stream) const = 0;
  virtual MlaAttendPlan plan_attend(const MlaAttendShape& shape) const { return {}; }
  virtual Status attend(const MlaAttendArgs& args, Stream stream) const = 0;
  virtual Status gather(const KvGatherArgs& args, Stream stream) const = 0;
  // How a DSA architecture's lightning indexer stores its keys beside this layout's pages (kiln/indexer_key_format.h):
  // the layout is the recipe's one choice of cache precision, so it decides for the indexer too. Appended in ABI 2.4
  // (the loader refuses kv_layout plugins built against an older SDK, whose vtables lack it).
  virtual IndexerKeyFormat indexer_key_format() const { return IndexerKeyFormat::kFp32; }
};

}  // namespace kiln
