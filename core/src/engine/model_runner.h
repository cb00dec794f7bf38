// What the serving engine drives: one batched forward pass over sequence steps whose KV pages the engine's
// BlockManager assigned. An interface so scheduling, paging and sampling are tested without a model
// (tests/engine uses a fake whose "KV" is the token ids themselves).
#pragma once

#include <cstdint>
#include <span>

#include "kiln/status.h"
#include "model/mla_moe_model.h"

namespace kiln {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Writes the KV of every step's tokens at the slots its block table gives (slot = block · block_size +
  // position % block_size) and returns, per step, its last token's logits row (every token's with all_logits):
  // out.logits is [rows, vocab_size()], out.first_row[i] the first row of step i.
  virtual Status forward(std::span<const SequenceStep> steps, StepOutput& out) = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace kiln
