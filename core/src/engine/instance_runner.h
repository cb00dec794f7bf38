// The real ModelRunner: a model instance (on the CPU or a GPU) stepping over its CacheManager's memory.
#pragma once

#include "engine/cache_manager.h"
#include "engine/model_runner.h"
#include "model/model_instance.h"

namespace kiln {

class InstanceRunner final : public ModelRunner {
 public:
  // Both must outlive the runner.
  InstanceRunner(ModelInstance& model, const CacheManager& caches) : model_(model), caches_(caches) {}
  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const StepOptions& options,
              StepOutput& out) override {
    return model_.step(steps, select, caches_.views(), options, out);
  }
  int64_t vocab_size() const override { return model_.vocab_size(); }
  int64_t hidden_size() const override { return model_.hidden_size(); }
  BatchInvariance batch_invariance() const override { return model_.batch_invariance(); }
  // CPU: host selection (model/host_token_select). CUDA: uploaded with the selection and applied on the device —
  // adjustments, masks and min_p in the host's order (kernels/cuda/logit_adjust, token_mask), logprobs taken from
  // the rows before them (kernels/cuda/logprobs) — in runtime/cuda/cuda_token_selection.
  bool reports_logprobs() const override { return true; }
  bool applies_token_masks() const override { return true; }
  bool applies_logit_adjustments() const override { return true; }

 private:
  ModelInstance& model_;
  const CacheManager& caches_;
};

}  // namespace kiln
