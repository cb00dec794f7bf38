// How far a model step is batch-invariant: up to `rows` rows in one step (every token of every sequence it
// carries) and `logit_rows` rows whose logits it computes, a decode-shaped row's results (its KV entry, hidden
// state, logits) are bitwise the same whatever other rows share the step. Speculative decoding is lossless only
// inside it: a verification pass of 1 + K rows must reproduce what K + 1 plain decode steps compute, so the engine
// keeps every pass that verifies drafts within the bound (engine/draft_depth.h). The CPU model holds at any size;
// the CUDA runner up to kBatchInvariantMaxRows rows and its lm_head's bound (runtime/cuda/cuda_model_step.h).
#pragma once

#include <cstdint>
#include <limits>

namespace kiln {

struct BatchInvariance {
  static constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();
  int64_t rows = kUnbounded;
  int64_t logit_rows = kUnbounded;
  bool bounded() const { return rows != kUnbounded || logit_rows != kUnbounded; }
};

}  // namespace kiln
