// The real ModelRunner: the MLA + MoE model's forward pass over a KV pool the runner owns.
// The pool's block ids are handed out by the engine's BlockManager, never by KvCache::reserve/release:
// nothing else may allocate from this KvCache.
#pragma once

#include <memory>

#include "engine/model_runner.h"
#include "model/kv_cache.h"
#include "model/mla_moe_model.h"

namespace kiln {

class MlaMoeRunner final : public ModelRunner {
 public:
  // `model` must outlive the runner.
  MlaMoeRunner(const MlaMoeModel& model, std::unique_ptr<KvCache> kv) : model_(model), kv_(std::move(kv)) {}

  Status forward(std::span<const SequenceStep> steps, StepOutput& out) override {
    return model_.forward(steps, *kv_, out);
  }
  int64_t vocab_size() const override { return model_.config().vocab_size; }
  const KvCache& kv() const { return *kv_; }

 private:
  const MlaMoeModel& model_;
  std::unique_ptr<KvCache> kv_;
};

}  // namespace kiln
