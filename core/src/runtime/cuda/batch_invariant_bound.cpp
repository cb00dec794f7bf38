#include "runtime/cuda/batch_invariant_bound.h"

#include <algorithm>

#include "runtime/cuda/cuda_model_step.h"

namespace kiln::cuda {

static_assert(kBatchInvariantMaxRows == kCudaBatchInvariantMaxRows, "recipe check states the runner's bound");

BatchInvariantBound::BatchInvariantBound() : rows_(kBatchInvariantMaxRows) {}

void BatchInvariantBound::add(const Linear* linear) {
  if (linear) rows_ = std::min(rows_, linear->batch_invariant_rows());
}

void BatchInvariantBound::add(const ExpertSet* experts) {
  if (experts) rows_ = std::min(rows_, experts->batch_invariant_rows());
}

void BatchInvariantBound::add(const GpuLayer& w) {
  for (const Linear* l : {w.qkv_a.get(), w.q_proj.get(), w.kv_a.get(), w.q_b.get(), w.o_proj.get(), w.gate_up.get(),
                          w.down.get()})
    add(l);
  // kv_b is not run as a Linear: the runner's own absorption (skinny) and expansion GEMMs read its dense copy.
  if (w.indexer) {
    add(w.indexer->wq_b.get());
    add(w.indexer->wk.get());
    add(w.indexer->weights_proj.get());
  }
  add(w.experts.get());
}

void BatchInvariantBound::add_absorption(const ModelConfig& config) {
  if (!absorbs_with_skinny_gemm(config, 1)) rows_ = std::min<int64_t>(rows_, 1);
}

BatchInvariance BatchInvariantBound::bound(const Linear* lm_head) const {
  BatchInvariance b;
  b.rows = std::max<int64_t>(rows_, 0);
  // Every logit row is also a row of the step.
  b.logit_rows = lm_head ? std::clamp<int64_t>(lm_head->batch_invariant_rows(), 0, b.rows) : b.rows;
  // A sequence bringing kPrefillMinTokens tokens attends through the expanded-form prefill kernel.
  b.chunk_rows = std::min<int64_t>(kPrefillMinTokens - 1, b.rows);
  return b;
}

}  // namespace kiln::cuda
