#include "engine/draft_depth.h"

#include <algorithm>

namespace kiln {

int64_t fair_draft_depth(int64_t depth, int64_t decoding, int64_t drafting, PassRows chunks,
                         const BatchInvariance& bound) {
  if (depth <= 0 || drafting <= 0) return 0;
  // Rows left for drafts once every decoding sequence has its own row and the chunks theirs (no overflow: the
  // unbounded limit less a few rows stays positive).
  const int64_t rows_left = bound.rows - decoding - chunks.rows;
  const int64_t logits_left = bound.logit_rows - decoding - chunks.logit_rows;
  const int64_t left = std::min(rows_left, logits_left);
  // A verification pass of 1 + K rows must stay decode-shaped (model/batch_invariance.h).
  const int64_t depth_cap = std::min(depth, bound.chunk_rows - 1);
  if (left < drafting || depth_cap <= 0) return 0;
  return std::min(depth_cap, left / drafting);
}

}  // namespace kiln
