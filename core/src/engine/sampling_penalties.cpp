#include "engine/sampling_penalties.h"

#include <algorithm>
#include <map>

namespace kiln {

SequencePenalties::SequencePenalties(const SamplingOptions& o, std::span<const int32_t> prompt)
    : presence_(o.presence_penalty), frequency_(o.frequency_penalty), repetition_(o.repetition_penalty) {
  // A token named twice in logit_bias keeps its last value, as a JSON object's repeated key would.
  for (const auto& [token, value] : o.logit_bias) bias_[token] = value;
  if (repetition_ != 1.0f) {
    prompt_tokens_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()), prompt_tokens_.end());
  }
}

void SequencePenalties::follow(std::span<const int32_t> tokens, int64_t prompt_len) {
  const int64_t generated = static_cast<int64_t>(tokens.size()) - prompt_len;
  for (; counted_ < generated; ++counted_) ++output_counts_[tokens[prompt_len + counted_]];
}

void SequencePenalties::fill_row(const std::unordered_map<int32_t, int32_t>& counts,
                                 std::vector<LogitAdjustment>& out) const {
  // Ascending token order, so a row's adjustments do not depend on hash-table iteration order.
  std::map<int32_t, LogitAdjustment> row;
  auto at = [&](int32_t token) -> LogitAdjustment& {
    auto [it, inserted] = row.try_emplace(token);
    if (inserted) it->second.token = token;
    return it->second;
  };
  for (const auto& [token, value] : bias_) at(token).bias = value;
  if (repetition_ != 1.0f) {
    for (int32_t token : prompt_tokens_) at(token).repetition = repetition_;
    for (const auto& [token, n] : counts) at(token).repetition = repetition_;
  }
  if (presence_ != 0.0f || frequency_ != 0.0f)
    for (const auto& [token, n] : counts)
      at(token).add = -(frequency_ * static_cast<float>(n) + presence_ * (n > 0 ? 1.0f : 0.0f));
  for (const auto& [token, a] : row) out.push_back(a);
}

void SequencePenalties::fill(std::span<const int32_t> drafts, std::vector<LogitAdjustment>& out,
                             std::vector<int32_t>& offsets) const {
  out.clear();
  offsets.assign(1, 0);
  if (drafts.empty()) {
    fill_row(output_counts_, out);
    offsets.push_back(static_cast<int32_t>(out.size()));
    return;
  }
  std::unordered_map<int32_t, int32_t> counts = output_counts_;
  for (size_t t = 0; t <= drafts.size(); ++t) {
    if (t > 0) ++counts[drafts[t - 1]];
    fill_row(counts, out);
    offsets.push_back(static_cast<int32_t>(out.size()));
  }
}

}  // namespace kiln
