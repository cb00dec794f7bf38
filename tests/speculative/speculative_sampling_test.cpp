// Verification math: greedy acceptance exactly, and rejection sampling statistically — many seeded draws on a
// toy vocabulary with a deliberately wrong draft distribution q must still follow the target distribution p.
// Pearson chi-square at significance 0.001 (critical values: 7 dof 24.32, 63 dof 103.44); fixed seeds make each
// test deterministic, and a control shows the same statistic rejects q's own samples.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/speculative_sampling.h"

namespace kiln {
namespace {

constexpr int64_t kV = 8;
constexpr double kChi2Crit7 = 24.32;    // chi-square 0.999 quantile, 7 degrees of freedom
constexpr double kChi2Crit63 = 103.44;  // 63 degrees of freedom

std::vector<float> one_hot_logits(const std::vector<int32_t>& argmaxes) {
  std::vector<float> l(argmaxes.size() * kV, 0.0f);
  for (size_t r = 0; r < argmaxes.size(); ++r) l[r * kV + argmaxes[r]] = 5.0f;
  return l;
}

TEST(VerifyGreedy, AcceptsAllDraftsAndAddsTheBonus) {
  const auto logits = one_hot_logits({3, 1, 4, 6});
  const std::vector<int32_t> drafts{3, 1, 4};
  Verification v = verify_greedy(logits.data(), kV, drafts);
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{3, 1, 4, 6}));
}

TEST(VerifyGreedy, StopsAtTheFirstMismatchWithTheTargetsToken) {
  const auto logits = one_hot_logits({3, 1, 4, 6});
  const std::vector<int32_t> drafts{3, 2, 4};  // the third draft matches but follows a rejection
  Verification v = verify_greedy(logits.data(), kV, drafts);
  EXPECT_EQ(v.accepted, 1);
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{3, 1}));
  const std::vector<int32_t> wrong_first{0, 1, 4};
  v = verify_greedy(logits.data(), kV, wrong_first);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{3}));
}

TEST(VerifyGreedy, NoDraftsEmitsTheTargetsToken) {
  const auto logits = one_hot_logits({5});
  Verification v = verify_greedy(logits.data(), kV, {});
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{5}));
}

std::vector<float> softmax(const float* logits, float t = 1.0f) {
  std::vector<float> p(kV);
  double m = logits[0], s = 0;
  for (int64_t i = 1; i < kV; ++i) m = std::max<double>(m, logits[i]);
  for (int64_t i = 0; i < kV; ++i) s += p[i] = static_cast<float>(std::exp((logits[i] - m) / t));
  for (auto& x : p) x = static_cast<float>(x / s);
  return p;
}

int32_t draw(const std::vector<float>& q, std::mt19937_64& rng) {
  return cpu::sample_from_distribution(q.data(), kV, rng);
}

// Pearson's statistic of `counts` against `expected` probabilities; a count where p = 0 is infinitely unlikely.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& expected, int64_t n) {
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected[i] * static_cast<double>(n);
    if (e == 0) {
      if (counts[i] != 0) return INFINITY;
      continue;
    }
    EXPECT_GE(e, 5.0) << "cell " << i << " too small for the chi-square approximation";
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

const float kTargetLogits[kV] = {1.2f, -0.3f, 0.8f, 2.0f, -1.0f, 0.1f, 0.5f, -0.6f};
const float kDraftLogits[kV] = {-0.5f, 1.5f, -1.0f, 0.2f, 1.1f, -0.2f, 0.9f, 0.7f};  // deliberately wrong

// The first emitted token of one verification with K = 1 over many draws.
void check_first_token(const cpu::SamplingParams& params, bool greedy_draft) {
  std::vector<float> p(kV);
  cpu::sampling_distribution(kTargetLogits, kV, params, p.data());
  const std::vector<float> q = softmax(kDraftLogits);
  const int32_t q_argmax = 1;
  std::vector<float> logits(2 * kV);
  std::copy_n(kTargetLogits, kV, logits.data());
  std::copy_n(kTargetLogits, kV, logits.data() + kV);  // bonus row (unused for the first token)
  std::mt19937_64 draft_rng(11), verify_rng(12);
  constexpr int64_t kN = 200000;
  std::vector<int64_t> counts(kV, 0), draft_counts(kV, 0);
  for (int64_t n = 0; n < kN; ++n) {
    const int32_t x = greedy_draft ? q_argmax : draw(q, draft_rng);
    ++draft_counts[x];
    const std::vector<int32_t> drafts{x};
    Verification v = verify_sampling(logits.data(), kV, drafts, greedy_draft ? nullptr : q.data(), params, verify_rng);
    ASSERT_EQ(static_cast<int64_t>(v.tokens.size()), v.accepted + 1);
    ++counts[v.tokens[0]];
  }
  std::vector<double> expected(p.begin(), p.end());
  const double chi = chi_square(counts, expected, kN);
  EXPECT_LT(chi, kChi2Crit7) << "emitted tokens do not follow p";
  // Control: the drafts themselves (what accepting everything would emit) are rejected by the same test.
  EXPECT_GT(chi_square(draft_counts, expected, kN), kChi2Crit7);
}

TEST(VerifySampling, FirstTokenFollowsTargetWithWrongDraftDistribution) {
  cpu::SamplingParams params;
  params.temperature = 0.8f;
  check_first_token(params, /*greedy_draft=*/false);
}

TEST(VerifySampling, FirstTokenFollowsTargetWithGreedyDrafts) {
  cpu::SamplingParams params;
  params.temperature = 1.3f;
  check_first_token(params, /*greedy_draft=*/true);
}

TEST(VerifySampling, FirstTokenFollowsTopKTopPTarget) {
  cpu::SamplingParams params;
  params.temperature = 0.9f;
  params.top_k = 6;
  params.top_p = 0.85f;
  std::vector<float> p(kV);
  cpu::sampling_distribution(kTargetLogits, kV, params, p.data());
  ASSERT_GT(std::count(p.begin(), p.end(), 0.0f), 2);  // truncation is in play: those tokens must never appear
  check_first_token(params, /*greedy_draft=*/false);
}

// A context-dependent toy model: the next-token logits depend on the previous token. Generate two tokens with
// K = 3 speculative steps (drafts from a wrong q), repeating passes until two are emitted; the joint of the two
// must be p(a | c)·p(b | a).
TEST(VerifySampling, TwoTokenJointFollowsTargetAcrossPasses) {
  std::mt19937_64 init(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> target(kV * kV), draft(kV * kV);
  for (auto& x : target) x = normal(init);
  for (auto& x : draft) x = normal(init);
  cpu::SamplingParams params;
  params.temperature = 1.0f;
  auto p_row = [&](int32_t prev) {
    std::vector<float> p(kV);
    cpu::sampling_distribution(target.data() + prev * kV, kV, params, p.data());
    return p;
  };
  constexpr int32_t kContext = 3;
  constexpr int kDepth = 3;
  constexpr int64_t kN = 200000;
  std::mt19937_64 draft_rng(21), verify_rng(22);
  std::vector<int64_t> counts(kV * kV, 0);
  for (int64_t n = 0; n < kN; ++n) {
    std::vector<int32_t> out;
    int32_t last = kContext;
    while (out.size() < 2) {
      std::vector<int32_t> drafts;
      std::vector<float> q_rows, logits(target.begin() + last * kV, target.begin() + (last + 1) * kV);
      int32_t prev = last;
      for (int k = 0; k < kDepth; ++k) {
        const std::vector<float> q = softmax(draft.data() + prev * kV);
        prev = draw(q, draft_rng);
        drafts.push_back(prev);
        q_rows.insert(q_rows.end(), q.begin(), q.end());
        logits.insert(logits.end(), target.begin() + prev * kV, target.begin() + (prev + 1) * kV);
      }
      Verification v = verify_sampling(logits.data(), kV, drafts, q_rows.data(), params, verify_rng);
      out.insert(out.end(), v.tokens.begin(), v.tokens.end());
      last = out.back();
    }
    ++counts[out[0] * kV + out[1]];
  }
  std::vector<double> expected(kV * kV);
  const auto p0 = p_row(kContext);
  for (int32_t a = 0; a < kV; ++a) {
    const auto p1 = p_row(a);
    for (int32_t b = 0; b < kV; ++b) expected[a * kV + b] = static_cast<double>(p0[a]) * p1[b];
  }
  EXPECT_LT(chi_square(counts, expected, kN), kChi2Crit63);
}

}  // namespace
}  // namespace kiln
