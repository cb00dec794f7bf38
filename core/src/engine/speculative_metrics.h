// Counters of speculative decoding (the figures §2 of the serving-techniques spec defines): acceptance rate =
// accepted / drafted, mean acceptance length = 1 + accepted / drafts (tokens emitted per target pass), and
// per-position acceptance (how often draft i was accepted, over the steps that proposed one at i).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

struct SpeculativeMetrics {
  int64_t drafts = 0;    // verification passes that carried at least one draft
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // draft tokens accepted
  std::vector<int64_t> drafted_at, accepted_at;  // per draft position 0..K−1
  // Steps whose drafting the runner's batch-invariance bound held below what the sequences would have drafted
  // (a shallower depth, or none): the passes then verify fewer drafts than K (draft_depth.h).
  int64_t bound_limited_steps = 0;

  void record(int64_t num_drafted, int64_t num_accepted) {
    if (num_drafted <= 0) return;
    ++drafts;
    drafted += num_drafted;
    accepted += num_accepted;
    if (static_cast<int64_t>(drafted_at.size()) < num_drafted) {
      drafted_at.resize(num_drafted, 0);
      accepted_at.resize(num_drafted, 0);
    }
    for (int64_t i = 0; i < num_drafted; ++i) ++drafted_at[i];
    for (int64_t i = 0; i < num_accepted; ++i) ++accepted_at[i];
  }
  double acceptance_rate() const { return drafted ? static_cast<double>(accepted) / drafted : 0.0; }
  double mean_acceptance_length() const { return drafts ? 1.0 + static_cast<double>(accepted) / drafts : 0.0; }
  double acceptance_rate_at(size_t i) const {
    return i < drafted_at.size() && drafted_at[i] ? static_cast<double>(accepted_at[i]) / drafted_at[i] : 0.0;
  }
};

}  // namespace kiln
