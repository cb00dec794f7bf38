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
  bool reports_logprobs() const override { return model_.device().is_cpu(); }
  // CPU: masked in host selection; CUDA: uploaded with the selection and applied on the device (kernels/cuda/token_mask).
  bool applies_token_masks() const override { return true; }
  bool applies_logit_adjustments() const override { return model_.device().is_cpu(); }

 private:
  ModelInstance& model_;
  const CacheManager& caches_;
};

}  // namespace kiln
