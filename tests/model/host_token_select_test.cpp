// The host token selection's row adjustments: logit_bias and penalties applied per verification row, min_p as a
// logit threshold equal to its probability definition, and malformed adjustment lists refused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "model/host_token_select.h"

namespace kiln {
namespace {

TEST(HostTokenSelect, AdjustmentsBiasThenRepetitionThenAdd) {
  std::vector<float> row = {2.0f, -2.0f, 0.5f, 1.0f};
  const std::vector<LogitAdjustment> adj = {{0, 0.0f, 2.0f, 0.0f},     // 2 / 2
                                            {1, 0.0f, 2.0f, -0.5f},    // −2 · 2 − 0.5
                                            {2, -1.0f, 4.0f, 0.0f},    // (0.5 − 1) · 4: the bias first
                                            {3, 1.0f, 1.0f, -0.25f}};  // 1 + 1 − 0.25
  apply_logit_adjustments(row.data(), adj);
  EXPECT_FLOAT_EQ(row[0], 1.0f);
  EXPECT_FLOAT_EQ(row[1], -4.5f);
  EXPECT_FLOAT_EQ(row[2], -2.0f);
  EXPECT_FLOAT_EQ(row[3], 1.75f);
}

// min_p keeps exactly the tokens whose probability at temperature T is ≥ min_p × the largest one.
TEST(HostTokenSelect, MinPIsItsProbabilityDefinition) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (const float temperature : {0.3f, 1.0f, 1.7f})
    for (const float min_p : {0.01f, 0.2f, 0.9f, 1.0f}) {
      std::vector<float> logits(257);
      for (float& x : logits) x = n(rng);
      cpu::SamplingParams p{temperature, 0, 1.0f};
      std::vector<float> probs(logits.size());
      cpu::sampling_distribution(logits.data(), static_cast<int64_t>(logits.size()), p, probs.data());
      const float pmax = *std::max_element(probs.begin(), probs.end());
      std::vector<float> cut = logits;
      apply_min_p(cut.data(), static_cast<int64_t>(cut.size()), min_p, temperature);
      int kept = 0;
      for (size_t v = 0; v < logits.size(); ++v) {
        const bool keep = std::isfinite(cut[v]);
        kept += keep;
        // Within float rounding of the boundary either answer is right.
        if (std::fabs(probs[v] - min_p * pmax) > 1e-6f * pmax)
          EXPECT_EQ(keep, probs[v] >= min_p * pmax) << "token " << v << " T " << temperature << " min_p " << min_p;
        if (keep) EXPECT_EQ(cut[v], logits[v]);
      }
      EXPECT_GE(kept, 1);
    }
}

// Verification rows take their own adjustments: a bias that makes row 1 prefer token 2 makes the second draft (2)
// accepted, and the bonus row's bias picks the bonus token; without the adjustments the drafts are rejected.
TEST(HostTokenSelect, EachVerificationRowTakesItsOwnAdjustments) {
  const int64_t vocab = 4;
  // Three rows, all preferring token 0.
  const std::vector<float> logits = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0};
  const std::vector<int32_t> drafts = {0, 2};
  TokenSelection s;
  s.select = true;
  s.num_drafts = 2;
  s.drafts = drafts;
  const std::vector<LogitAdjustment> adj = {{2, 5.0f, 1.0f, 0.0f}, {3, 5.0f, 1.0f, 0.0f}};
  const std::vector<int32_t> offsets = {0, 0, 1, 2};  // row 0 none, row 1 → token 2, row 2 → token 3
  s.adjustments = adj;
  s.adjustment_offsets = offsets;
  const std::vector<int64_t> first_row = {0};
  StepOutput out;
  ASSERT_TRUE(select_tokens_host(logits.data(), vocab, first_row, {&s, 1}, out).ok());
  EXPECT_EQ(out.tokens[0], (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(out.accepted[0], 2);

  TokenSelection plain = s;
  plain.adjustments = {};
  plain.adjustment_offsets = {};
  ASSERT_TRUE(select_tokens_host(logits.data(), vocab, first_row, {&plain, 1}, out).ok());
  EXPECT_EQ(out.tokens[0], (std::vector<int32_t>{0, 0}));
}

TEST(HostTokenSelect, MalformedAdjustmentsAreRefused) {
  const std::vector<float> logits(8, 0.0f);
  const std::vector<int64_t> first_row = {0};
  TokenSelection s;
  s.select = true;
  StepOutput out;
  const std::vector<LogitAdjustment> bad_token = {{9, 1.0f, 1.0f, 0.0f}};
  const std::vector<int32_t> one = {0, 1};
  s.adjustments = bad_token;
  s.adjustment_offsets = one;
  EXPECT_FALSE(select_tokens_host(logits.data(), 8, first_row, {&s, 1}, out).ok());
  const std::vector<LogitAdjustment> ok_token = {{3, 1.0f, 1.0f, 0.0f}};
  s.adjustments = ok_token;
  const std::vector<int32_t> wrong_count = {0, 1, 1};
  s.adjustment_offsets = wrong_count;
  EXPECT_FALSE(select_tokens_host(logits.data(), 8, first_row, {&s, 1}, out).ok());
  const std::vector<LogitAdjustment> zero_rep = {{3, 0.0f, 0.0f, 0.0f}};
  s.adjustments = zero_rep;
  s.adjustment_offsets = one;
  EXPECT_FALSE(select_tokens_host(logits.data(), 8, first_row, {&s, 1}, out).ok());
  s.adjustments = ok_token;
  EXPECT_TRUE(select_tokens_host(logits.data(), 8, first_row, {&s, 1}, out).ok());
  EXPECT_EQ(out.tokens[0], (std::vector<int32_t>{3}));
}

}  // namespace
}  // namespace kiln
