// What the serving engine drives: one batched step over sequence steps whose KV pages the engine's CacheManager
// assigned, token selection included (on the model's device: only token ids come back). An interface so scheduling,
// paging and sampling are tested without a model (tests/engine uses a fake whose "KV" is the token ids themselves).
#pragma once

#include <cstdint>
#include <span>

#include "kiln/status.h"
#include "model/batch_invariance.h"
#include "model/model_step.h"

namespace kiln {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Writes the KV of every step's tokens at the slots its block table gives (slot = block · block_size +
  // position % block_size), then per step selects what `select` asks (one entry per step): out.tokens[i] and
  // out.accepted[i]. With options.tap_layers, out.taps holds those layers' outputs for every token of the step
  // (on the model's device) until the next step.
  virtual Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select,
                      const StepOptions& options, StepOutput& out) = 0;
  virtual int64_t vocab_size() const = 0;
  // Rows (and logit rows) of one step() within which every row's results are independent of the others: the
  // engine keeps each pass that verifies drafts inside it, so drafting stays lossless (model/batch_invariance.h).
  virtual BatchInvariance batch_invariance() const { return {}; }
  // The width of the embedding rows a step's media may carry (the model's hidden size); 0: it takes no media.
  virtual int64_t hidden_size() const { return 0; }
  // Whether step() fills StepOutput::logprobs for selections that ask (the host and the CUDA token selection do).
  virtual bool reports_logprobs() const { return false; }
  // Whether step() honours TokenSelection::allowed (the host and the CUDA token selection do).
  virtual bool applies_token_masks() const { return false; }
  // Whether step() honours TokenSelection::adjustments and min_p (the host and the CUDA token selection do).
  virtual bool applies_logit_adjustments() const { return false; }
};

}  // namespace kiln
