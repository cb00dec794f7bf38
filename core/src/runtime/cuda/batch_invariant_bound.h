// The batch-invariance bound of a CUDA model step (model/batch_invariance.h): kBatchInvariantMaxRows rows for the
// kernels the runner owns (cuda_model_step.h says why), lowered to what the weight format's Linear and ExpertSet
// objects of the trunk promise (Linear::batch_invariant_rows), and for logit rows to the lm_head's promise (the
// built-in dense head: kSkinnyGemmMaxRowsWideOut = 32 since 2026-12-03, 8 before, for a vocabulary wider than
// kSkinnyGemmWideOut).
//
// Linear::batch_invariant_rows answers for a plain run; a projection the step runs with the SwiGLU epilogue may hold
// further (the built-in fused path holds to kSkinnyGemmMaxRows), but the SDK does not say so, and the plain promise
// is the one every path keeps. A dense MLP wider than kSkinnyGemmWideOut (GLM-4.7-Flash's layer 0: 2 × 10240)
// promises kSkinnyGemmMaxRowsWideOut rows like the lm_head, so GLM-4.7-Flash's bound is 32 rows, 32 logit rows.
#pragma once

#include <cstdint>

#include "kiln/weight_format.h"
#include "model/batch_invariance.h"
#include "model/model_config.h"
#include "runtime/cuda/gpu_weights.h"

namespace kiln::cuda {

class BatchInvariantBound {
 public:
  BatchInvariantBound();
  // Null pieces (absent projections) promise nothing and limit nothing.
  void add(const Linear* linear);
  void add(const ExpertSet* experts);
  // Every Linear and ExpertSet of a decoder layer (attention, DSA indexer, MLP or MoE).
  void add(const GpuLayer& layer);
  // The runner's own per-head absorption GEMMs: skinny (invariant) only for 16-byte aligned head widths.
  void add_absorption(const ModelConfig& config);
  // The bound of steps whose logits come from `lm_head` (null: no logits).
  BatchInvariance bound(const Linear* lm_head) const;

 private:
  int64_t rows_;
};

}  // namespace kiln::cuda
