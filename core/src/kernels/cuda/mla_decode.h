// Absorbed MLA decode attention over the paged bf16 latent cache (the GPU form of KvLayout::attend for the
// built-in bf16 layout; math of cpu::mla_attention_absorbed_bf16).
//
// Pages are bf16 [block_size, 512 + rope_dim]: 512 latent values then rope_dim (64, or 0 without a rope part)
// roped k_pe values per token; token p of a
// sequence lives at slot block_tables[seq, p / block_size] · block_size + p % block_size. Each query row is
// one CTA column of up to 32 (row, head) pairs: its score and value products run on the tensor cores (bf16
// operands, fp32 accumulation; q is rounded to bf16) with the pairs in the mma N dimension, q held in registers,
// and the cache streamed once per CTA through shared memory; long contexts are split over `num_splits` CTAs per
// row whose partial results (fp32 output + log-sum-exp per head) a second kernel merges (flash-decoding). Both
// kernels are launched with programmatic dependent launch (pdl.cuh) and wait for the previous kernel before
// reading q, kv_len, the tables or the cache.
//
// Row groups: consecutive rows of one sequence (speculative verification's 1 + K rows, a prefill chunk) can share
// each cache tile: their (row, head) pairs are packed into the tensor-core N dimension (up to 32 per CTA, the
// pairs of a group spread evenly over ceil(rows · heads / 32) CTAs), every row masked by its own kv_len, so the
// cache is read once per group and CTA instead of once per row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

inline constexpr int64_t kMlaLatentDim = 512;
inline constexpr int64_t kMlaRopeDim = 64;

struct MlaDecodeParams {
  int64_t rope_dim = kMlaRopeDim;         // 64, or 0 for rows of the latent alone (NoPE: GLM-5.3-Flash's DSA)
  const float* q = nullptr;               // [num_queries, num_heads, 512 + rope_dim]: absorbed q_lat then roped q_pe
  int64_t num_queries = 0;
  int64_t num_heads = 0;                  // any count; up to 32 (row, head) pairs per CTA
  const uint16_t* cache = nullptr;        // this layer's pages
  int64_t block_size = 0;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks]
  int64_t max_blocks = 0;
  const int32_t* query_seq = nullptr;     // [num_queries]: row of block_tables
  const int32_t* kv_len = nullptr;        // [num_queries]: positions 0..kv_len-1 are visible
  const int32_t* selected = nullptr;      // optional [num_queries, selected_width] DSA positions, −1 padded,
  int64_t selected_width = 0;             //   each position at most once (top-k output); null = all visible
  float scale = 1.0f;
  float* out = nullptr;                   // [num_queries, num_heads, 512] fp32; may be null when out_bf16 is set
  uint16_t* out_bf16 = nullptr;           // optional [num_queries, num_heads, 512] bf16 (round to nearest even) of
                                          //   the same values, written by the last kernel instead of a cast launch
  int num_splits = 1;                     // ≥ 1; > 1 needs workspace
  // false: a row's tiles are cut into num_splits equal parts. true: into parts of
  // mla_decode_tiles_per_split(its own tile count) tiles, so a row is split and merged the same way whatever
  // else shares the step (batch invariance); num_splits must then be mla_decode_length_splits(max_keys) or more.
  bool split_by_length = false;
  void* workspace = nullptr;              // mla_decode_workspace_bytes(...) bytes of device memory
  // Optional row groups (dense attention only, selected must be null): [num_groups + 1] ascending first rows,
  // row_groups[0] = 0 and row_groups[num_groups] = num_queries; the rows of a group share one query_seq.
  // Null: every row is its own group.
  const int32_t* row_groups = nullptr;
  int64_t num_groups = 0;
  int64_t max_group_rows = 1;             // the largest group (sizes the grid)
};

// Group size cap used by mla_decode_row_groups (the kernel takes any size).
inline constexpr int64_t kMlaMaxGroupRows = 8;

// Host helper: the row_groups array for a host copy of query_seq — runs of consecutive rows of one sequence,
// cut every kMlaMaxGroupRows rows. Returns num_groups + 1 entries.
std::vector<int32_t> mla_decode_row_groups(const int32_t* query_seq, int64_t num_queries);

// A split count that gives about one wave of CTAs on `sm_count` multiprocessors for rows of up to max_keys
// keys (the longest context, or selected_width with DSA), with at least two 64-token tiles per split.
int mla_decode_num_splits(int64_t num_queries, int64_t num_heads, int64_t max_keys, int sm_count);

// The same for row groups (num_groups groups of at most max_group_rows rows); workspace is still sized by
// mla_decode_workspace_bytes(num_queries, ...), one partial per row and split.
int mla_decode_grouped_num_splits(int64_t num_groups, int64_t max_group_rows, int64_t num_heads, int64_t max_keys,
                                  int sm_count);

size_t mla_decode_workspace_bytes(int64_t num_queries, int64_t num_heads, int num_splits);

// split_by_length: two 64-key tiles per split up to kMlaLengthSplits splits per row, then evenly more tiles per
// split — about one wave of CTAs for one row on a 132-SM GPU, as a function of the row's length alone. (One tile
// per split was measured: c1 at 4K 0.10 ms a step faster, batch 16 at 4K 1.8 ms slower in partials and merging.)
inline constexpr int64_t kMlaLengthSplits = 128;
// The splits a row of max_keys keys needs under split_by_length (the grid's split dimension).
int mla_decode_length_splits(int64_t max_keys);

Status mla_decode_bf16(const MlaDecodeParams& params, StreamHandle stream);

}  // namespace kiln::cuda
