// A sequence's sampling penalties and logit_bias as per-row logit adjustments for the step's token selection
// (TokenSelection::adjustments). Row t of a verification pass sees the history the request would have after the
// drafts before it had been accepted one step at a time, so drafting stays lossless with penalties on.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/sampler.h"
#include "model/model_step.h"

namespace kiln {

class SequencePenalties {
 public:
  // `options.adjusts_logits()` should hold; the prompt's distinct tokens are what the repetition penalty sees before
  // any output.
  SequencePenalties(const SamplingOptions& options, std::span<const int32_t> prompt);

  // Counts the generated tokens it has not seen yet: `tokens` is the sequence's prompt then its output.
  void follow(std::span<const int32_t> tokens, int64_t prompt_len);

  // Rows 0 .. drafts.size(): row t's adjustments given the output so far and drafts[0 .. t).
  void fill(std::span<const int32_t> drafts, std::vector<LogitAdjustment>& out, std::vector<int32_t>& offsets) const;

 private:
  void fill_row(const std::unordered_map<int32_t, int32_t>& counts, std::vector<LogitAdjustment>& out) const;

  float presence_, frequency_, repetition_;
  std::unordered_map<int32_t, float> bias_;
  std::vector<int32_t> prompt_tokens_;  // distinct, ascending (only with a repetition penalty)
  std::unordered_map<int32_t, int32_t> output_counts_;
  int64_t counted_ = 0;  // output tokens counted so far
};

}  // namespace kiln
