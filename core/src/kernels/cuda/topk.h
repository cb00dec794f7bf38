// Row-wise top-k on the GPU (order of cpu::topk_indices: value descending, NaN last, ties by lower index).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

inline constexpr int64_t kMaxTopK = 2048;

// For each of `rows` rows of `n` fp32 values (row r at values + r·n): the indices of the top min(k, visible_r)
// values among the first visible_r, then −1 up to k. visible_r = n, or with causal_offset ≥ 0,
// min(n, causal_offset + r + 1) (the DSA rule: query r sees keys ≤ its position). out int32 [rows, k];
// k ≤ kMaxTopK. One block per row: a 4-pass radix select of the k-th key, an index-order compaction, a
// stable block sort.
Status topk_rows(const float* values, int64_t rows, int64_t n, int64_t k, int64_t causal_offset, int32_t* out,
                 StreamHandle stream);

// topk_rows over the rows a list names (no causal limit): out row r is the top k of values + row_ids[r]·n. For rows
// scattered through a larger array (the logits rows of a step whose selections ask for logprobs).
Status topk_listed_rows(const float* values, const int32_t* row_ids, int64_t rows, int64_t n, int64_t k, int32_t* out,
                        StreamHandle stream);

}  // namespace kiln::cuda
