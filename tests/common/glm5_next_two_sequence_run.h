// One fixed run of a glm5_next model on the CPU, for comparing parallel splits against one rank: two sequences in one
// batch — a 70-token prompt (past a KDA chunk, several indexer pools and every fixture's top-k) in chunks of 29 / 29 /
// 12 beside a 12-token one in chunks of 5 / 4 / 3 — then 8 greedy decode steps of both.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/glm5_next_test_model.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/tensor_parallel_instance.h"

namespace kiln::testing {

struct Glm5NextRun {
  std::vector<float> logits;    // every position's logits of the prompt chunks, then each decode step's
  std::vector<int32_t> tokens;  // greedy continuation of the long sequence
  std::vector<std::vector<char>> kda_state;  // per KDA layer and sequence: its whole slot (recurrent + conv state)
  int64_t rank_mismatches = 0;  // logits of a rank ≥ 1 that differ from rank 0's, over every step
};

inline Glm5NextRun run_two_sequences(LoadedModel& m) {
  const int64_t vocab = m.model->vocab_size();
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> tokens(2);
  for (int i = 0; i < 70; ++i) tokens[0].push_back(static_cast<int32_t>(rng() % (vocab - 1)) + 1);
  for (int i = 0; i < 12; ++i) tokens[1].push_back(static_cast<int32_t>(rng() % (vocab - 1)) + 1);
  Glm5NextCache cache(m, 2 * 192, 2);  // room for 160 tokens each in blocks of up to 32
  std::vector<std::vector<int32_t>> tables = {cache.table(160), cache.table(160)};
  auto* group = dynamic_cast<TensorParallelInstance*>(m.model.get());
  Glm5NextRun run;
  StepOutput o;
  StepOptions options;
  options.want_logits = true;
  const std::vector<std::vector<int64_t>> chunks = {{29, 29, 12}, {5, 4, 3}};
  std::vector<int64_t> done = {0, 0};
  auto step = [&](const std::vector<int64_t>& n, bool all_logits) {
    std::vector<SequenceStep> steps;
    for (int s = 0; s < 2; ++s) {
      SequenceStep st{std::span<const int32_t>(tokens[s].data() + done[s], n[s]), done[s], &tables[s], all_logits};
      st.state_slot = s;
      steps.push_back(st);
    }
    const Status status = m.model->step(steps, {}, cache.views(), options, o);
    EXPECT_TRUE(status.ok()) << status.to_string();
    for (int s = 0; s < 2; ++s) done[s] += n[s];
    for (int r = 1; status.ok() && group && r < group->world(); ++r) {
      const std::vector<float>& other = group->rank_output(r).logits;
      if (other.size() != o.logits.size()) ++run.rank_mismatches;
      else
        for (size_t i = 0; i < other.size(); ++i) run.rank_mismatches += other[i] != o.logits[i];
    }
    return status.ok();
  };
  for (int c = 0; c < 3; ++c) {
    if (!step({chunks[0][c], chunks[1][c]}, true)) return run;
    run.logits.insert(run.logits.end(), o.logits.begin(), o.logits.end());
  }
  for (int i = 0; i < 8; ++i) {
    for (int s = 0; s < 2; ++s) {  // the last row of sequence s
      const int64_t end = s + 1 < static_cast<int>(o.first_row.size()) ? o.first_row[s + 1]
                                                                        : static_cast<int64_t>(o.logits.size()) / vocab;
      const float* row = o.logits.data() + (end - 1) * vocab;
      tokens[s].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
      if (s == 0) run.tokens.push_back(tokens[s].back());
    }
    if (!step({1, 1}, false)) return run;
    run.logits.insert(run.logits.end(), o.logits.begin(), o.logits.end());
  }
  const auto* arch = dynamic_cast<const arch::Glm5NextArchitecture*>(m.arch.get());
  EXPECT_NE(arch, nullptr);
  if (!arch) return run;
  const glm5_next::Glm5NextConfig& c = arch->config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_kda(l)) continue;
    const char* slots = static_cast<const char*>(cache.views().entry(l, 0));
    for (int s = 0; s < 2; ++s)
      run.kda_state.emplace_back(slots + s * c.kda_state_bytes(), slots + (s + 1) * c.kda_state_bytes());
  }
  return run;
}

}  // namespace kiln::testing
