// The tensor-core absorbed-MLA decode attention that KV layouts share (kiln/cuda/mla_decode_tc.cuh): its parameters
// and its host-side planning (grid splits, workspace), in plain C++ so a layout's host half can plan without nvcc.
//
// Rows are 512 latent values then rope_dim (64, or 0 without a rope part) roped k_pe values per token, stored as
// the layout stores them (the kernel's row source turns a tile of them into bf16); token p of a sequence lives at
// slot block_tables[seq, p / block_size] · block_size + p % block_size. Each query row is one CTA column of up to
// 32 (row, head) pairs: its score and value products run on the tensor cores (bf16 operands, fp32 accumulation; q
// is rounded to bf16) with the pairs in the mma N dimension, q held in registers, and the cache streamed once per
// CTA through shared memory; long contexts are split over `num_splits` CTAs per row whose partial results (fp32
// output + log-sum-exp per head) a second kernel merges (flash-decoding). Both kernels are launched with
// programmatic dependent launch and wait for the previous kernel before reading q, kv_len, the tables or the cache.
//
// Row groups: consecutive rows of one sequence (speculative verification's 1 + K rows, a prefill chunk) can share
// each cache tile: their (row, head) pairs are packed into the tensor-core N dimension (up to 32 per CTA, the
// pairs of a group spread evenly over ceil(rows · heads / 32) CTAs), every row masked by its own kv_len, so the
// cache is read once per group and CTA instead of once per row. The mma columns are independent, so how pairs are
// packed never changes a pair's result.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define KILN_MLA_HOST_DEVICE __host__ __device__
#else
#define KILN_MLA_HOST_DEVICE
#endif

namespace kiln::cuda {

inline constexpr int64_t kMlaLatentDim = 512;
inline constexpr int64_t kMlaRopeDim = 64;
inline constexpr int64_t kMlaDecodeTile = 64;     // keys per pipeline stage
inline constexpr int64_t kMlaMaxPairs = 32;       // (row, head) pairs per CTA
inline constexpr int64_t kMlaMaxSplits = 1024;
// split_by_length: two 64-key tiles per split up to kMlaLengthSplits splits per row, then evenly more tiles per
// split — about one wave of CTAs for one row on a 132-SM GPU, as a function of the row's length alone. (One tile
// per split was measured: c1 at 4K 0.10 ms a step faster, batch 16 at 4K 1.8 ms slower in partials and merging.)
inline constexpr int64_t kMlaLengthSplits = 128;
// Group size cap used by mla_decode_row_groups (the kernel takes any size).
inline constexpr int64_t kMlaMaxGroupRows = 8;

struct MlaDecodeParams {
  int64_t rope_dim = kMlaRopeDim;         // 64, or 0 for rows of the latent alone (NoPE: GLM-5.3-Flash's DSA)
  const float* q = nullptr;               // [num_queries, num_heads, 512 + rope_dim]: absorbed q_lat then roped q_pe
  int64_t num_queries = 0;
  int64_t num_heads = 0;                  // any count; up to 32 (row, head) pairs per CTA
  const void* cache = nullptr;            // this layer's pages, in the row source's format
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
  float* out_lse = nullptr;               // optional [num_queries, num_heads]: each pair's log-sum-exp of its scaled
                                          //   scores (natural log; −inf where no key is visible, out then 0)
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
  // Optional 2 · kMlaSyncGroups zeroed counters the caller owns and keeps for every launch on one stream (the
  // kernel leaves them zero; kiln/cuda/mla_decode_sync.h): with them, a grid of at least kMlaKernelMergeMinSplits
  // splits that fits on the device at once merges its splits itself instead of in a second launch (same bits).
  unsigned* sync = nullptr;
};

// Row groups (grid.z) a kernel-side merge takes; larger grids merge in the second launch.
inline constexpr int64_t kMlaSyncGroups = 256;
inline constexpr size_t mla_decode_sync_bytes() { return sizeof(unsigned) * 2 * kMlaSyncGroups; }
// Fewer splits than this merge in the second launch: measured on an H200 (GLM-4.7-Flash shapes, c1, bench/RESULTS.md
// session 18), the in-grid merge gains 2.9–4.8 % at 128K and up to 0.9 % at 32K (128 splits) and loses 0.8 % at 4K
// and 2 % at batch 4 (32 splits), where the merge launch hides behind the decode kernel's tail.
inline constexpr int kMlaKernelMergeMinSplits = 64;

// Tiles per split under split_by_length: a function of the row's own tile count only (the kernel's too).
KILN_MLA_HOST_DEVICE inline constexpr int64_t mla_decode_tiles_per_split(int64_t tiles) {
  const int64_t spread = (tiles + kMlaLengthSplits - 1) / kMlaLengthSplits;
  return spread > 2 ? spread : 2;
}

// CTAs per group of `rows` rows: the fewest of at most kMlaMaxPairs (row, head) pairs each.
inline int64_t mla_decode_ctas_per_group(int64_t rows, int64_t heads) {
  return (rows * heads + kMlaMaxPairs - 1) / kMlaMaxPairs;
}

// Host helper: the row_groups array for a host copy of query_seq — runs of consecutive rows of one sequence,
// cut every kMlaMaxGroupRows rows. Returns num_groups + 1 entries.
inline std::vector<int32_t> mla_decode_row_groups(const int32_t* query_seq, int64_t num_queries) {
  std::vector<int32_t> first{0};
  for (int64_t i = 1; i < num_queries; ++i)
    if (query_seq[i] != query_seq[i - 1] || i - first.back() >= kMlaMaxGroupRows) first.push_back(static_cast<int32_t>(i));
  if (num_queries > 0) first.push_back(static_cast<int32_t>(num_queries));
  return first;
}

// A split count that gives about one wave of CTAs on `sm_count` multiprocessors for groups of up to max_group_rows
// rows and max_keys keys (the longest context, or selected_width with DSA), with at least two tiles per split;
// workspace is still sized by mla_decode_workspace_bytes(num_queries, ...), one partial per row and split.
inline int mla_decode_grouped_num_splits(int64_t num_groups, int64_t max_group_rows, int64_t num_heads,
                                         int64_t max_keys, int sm_count) {
  const int64_t ctas =
      std::max<int64_t>(1, num_groups * mla_decode_ctas_per_group(std::max<int64_t>(1, max_group_rows), num_heads));
  const int64_t by_occupancy = (sm_count + ctas - 1) / ctas;
  const int64_t by_length = std::max<int64_t>(1, (max_keys + 2 * kMlaDecodeTile - 1) / (2 * kMlaDecodeTile));
  return static_cast<int>(std::max<int64_t>(1, std::min(by_occupancy, by_length)));
}

// The same for one row per group.
inline int mla_decode_num_splits(int64_t num_queries, int64_t num_heads, int64_t max_keys, int sm_count) {
  return mla_decode_grouped_num_splits(num_queries, 1, num_heads, max_keys, sm_count);
}

// The splits a row of max_keys keys needs under split_by_length (the grid's split dimension).
inline int mla_decode_length_splits(int64_t max_keys) {
  const int64_t tiles = std::max<int64_t>(1, (max_keys + kMlaDecodeTile - 1) / kMlaDecodeTile);
  return static_cast<int>((tiles + mla_decode_tiles_per_split(tiles) - 1) / mla_decode_tiles_per_split(tiles));
}

inline size_t mla_decode_workspace_bytes(int64_t num_queries, int64_t num_heads, int num_splits) {
  if (num_splits <= 1) return 0;
  return sizeof(float) * static_cast<size_t>(num_splits) * num_queries * num_heads * (kMlaLatentDim + 1);
}

// Why these parameters cannot run (a sentence naming the field), or null.
inline const char* mla_decode_check(const MlaDecodeParams& p) {
  if (p.rope_dim != kMlaRopeDim && p.rope_dim != 0) return "rows are 512 latent values plus 64 or 0 rope values";
  if (p.num_queries < 0 || p.num_heads <= 0 || p.block_size <= 0 || p.num_splits < 1)
    return "need num_heads > 0, block_size > 0 and num_splits ≥ 1";
  if (!p.out && !p.out_bf16) return "need out or out_bf16";
  if (p.selected && p.selected_width <= 0) return "selected needs selected_width > 0";
  if (p.num_splits > kMlaMaxSplits) return "num_splits must be ≤ 1024";
  if (p.num_splits > 1 && !p.workspace) return "num_splits > 1 needs mla_decode_workspace_bytes of workspace";
  if (reinterpret_cast<uintptr_t>(p.q) % 16 != 0) return "q must be 16-byte aligned (it is read as float4)";
  if (p.row_groups && (p.selected || p.num_groups < 1 || p.max_group_rows < 1))
    return "row_groups needs dense attention, num_groups ≥ 1 and max_group_rows ≥ 1";
  return nullptr;
}

}  // namespace kiln::cuda
