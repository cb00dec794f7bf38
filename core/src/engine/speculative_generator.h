// Speculative generation for one sequence: the reference the batched engine loop is checked against, and what
// the lossless tests run. Per step the drafter (through the SDK interface only) proposes K tokens after the
// newest token; the target runs the newest token and the K drafts at once (1 + K positions, all logits);
// verification (engine/speculative_sampling.h) accepts a prefix and adds one target token.
//
// Rollback. Target: the KV rows written for rejected drafts (positions beyond the accepted length) are left in
// place; the next pass starts at the accepted length and overwrites them before any query can see them
// (attention is causal and a pass writes its own rows before attending). Drafter: rollback(seq, accepted
// length) after every pass, so drafter state beyond it is discarded.
#pragma once

#include <functional>
#include <vector>

#include "engine/generator.h"
#include "engine/speculative_metrics.h"
#include "kiln/drafter.h"
#include "model/kv_cache.h"
#include "model/mla_moe_model.h"

namespace kiln {

class SpeculativeGenerator {
 public:
  // depth = K, capped by the drafter's max_depth; `seq_id` names the sequence to the drafter. With `runner`
  // (the CUDA runner, whose pages mirror kv's block ids) the target runs through it, as in Generator.
  SpeculativeGenerator(const MlaMoeModel& model, KvCache& kv, Drafter& drafter, int depth, int64_t seq_id = 0,
                       ModelRunner* runner = nullptr);
  ~SpeculativeGenerator();

  // As Generator::generate: the generated ids (stop token included when one ended it); `on_token` sees each.
  Result<std::vector<int32_t>> generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                        const std::function<bool(int32_t)>& on_token, GenerateStats* stats = nullptr);

  // Accumulated over every generate() call.
  const SpeculativeMetrics& metrics() const { return metrics_; }

 private:
  void reset();

  const MlaMoeModel& model_;
  KvCache& kv_;
  ModelRunner* runner_;
  Drafter& drafter_;
  int depth_;
  int64_t seq_id_;
  bool drafter_has_sequence_ = false;
  std::vector<int32_t> table_;
  SpeculativeMetrics metrics_;
};

}  // namespace kiln
