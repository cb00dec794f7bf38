#include "kernels/cpu/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

TEST(Sampling, ArgmaxTakesLowestIndexOnTies) {
  const float v[] = {1, 5, 2, 5, -1};
  EXPECT_EQ(argmax(v, 5), 1);
  const float n[] = {NAN, 0.5f, 0.5f};
  EXPECT_EQ(argmax(n, 3), 1);
  const float single[] = {-3.0f};
  EXPECT_EQ(argmax(single, 1), 0);
}

TEST(Sampling, GreedyDoesNotDrawRandomNumbers) {
  auto logits = test::random_floats(1000, 71);
  std::mt19937_64 rng(5), untouched(5);
  EXPECT_EQ(sample(logits.data(), 1000, {0.0f, 0, 1.0f}, rng), argmax(logits.data(), 1000));
  EXPECT_EQ(sample(logits.data(), 1000, {0.8f, 1, 1.0f}, rng), argmax(logits.data(), 1000));
  EXPECT_EQ(rng(), untouched());
}

TEST(Sampling, SeedReproducesSequence) {
  auto logits = test::random_floats(5003, 72, -2.f, 2.f);
  const SamplingParams p{0.9f, 50, 0.95f};
  auto draw = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sample(logits.data(), 5003, p, rng));
    return out;
  };
  EXPECT_EQ(draw(1234), draw(1234));
  EXPECT_NE(draw(1234), draw(1235));
}

// fp64 reference of the documented pipeline: temperature, top-k, top-p, renormalise.
std::vector<double> distribution_ref(const std::vector<float>& logits, const SamplingParams& p) {
  const int64_t v = static_cast<int64_t>(logits.size());
  std::vector<int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int64_t k = (p.top_k > 0 && p.top_k < v) ? p.top_k : v;
  order.resize(k);
  std::vector<double> w(k);
  double z = 0;
  for (int64_t j = 0; j < k; ++j) z += (w[j] = std::exp((logits[order[j]] - logits[order[0]]) / p.temperature));
  int64_t keep = k;
  if (p.top_p < 1.0f) {
    double mass = 0;
    keep = 0;
    while (keep < k && (keep == 0 || mass < p.top_p)) mass += w[keep++] / z;
  }
  double kz = 0;
  for (int64_t j = 0; j < keep; ++j) kz += w[j];
  std::vector<double> out(v, 0.0);
  for (int64_t j = 0; j < keep; ++j) out[order[j]] = w[j] / kz;
  return out;
}

TEST(Sampling, DistributionMatchesFp64Reference) {
  for (const SamplingParams p : {SamplingParams{1.0f, 0, 1.0f}, SamplingParams{0.7f, 20, 1.0f},
                                 SamplingParams{1.3f, 0, 0.8f}, SamplingParams{0.5f, 100, 0.3f}}) {
    auto logits = test::random_floats(777, 73, -3.f, 3.f);
    std::vector<float> probs(777);
    sampling_distribution(logits.data(), 777, p, probs.data());
    const auto ref = distribution_ref(logits, p);
    for (int i = 0; i < 777; ++i) ASSERT_NEAR(probs[i], ref[i], 1e-6 * ref[i] + 1e-12) << i;
  }
}

TEST(Sampling, TopKAndTopPRestrictSupport) {
  auto logits = test::random_floats(300, 74, -1.f, 1.f);
  std::vector<int32_t> order(300);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const std::set<int32_t> top10(order.begin(), order.begin() + 10);
  std::mt19937_64 rng(9);
  std::set<int32_t> seen;
  for (int i = 0; i < 3000; ++i) {
    const int32_t t = sample(logits.data(), 300, {1.0f, 10, 1.0f}, rng);
    ASSERT_TRUE(top10.count(t)) << t;
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 10u);  // and every one of them is reachable

  // top_p: the smallest prefix whose mass reaches p.
  SamplingParams p{1.0f, 0, 0.5f};
  const auto ref = distribution_ref(logits, p);
  std::set<int32_t> support;
  for (int i = 0; i < 300; ++i)
    if (ref[i] > 0) support.insert(i);
  ASSERT_GT(support.size(), 1u);
  ASSERT_LT(support.size(), 300u);
  for (int i = 0; i < 3000; ++i) ASSERT_TRUE(support.count(sample(logits.data(), 300, p, rng)));
}

TEST(Sampling, EmpiricalFrequenciesFollowTheDistribution) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f};
  const SamplingParams p{1.0f, 0, 1.0f};
  const auto ref = distribution_ref(logits, p);
  std::mt19937_64 rng(77);
  std::vector<int> counts(4, 0);
  const int draws = 200000;
  for (int i = 0; i < draws; ++i) ++counts[sample(logits.data(), 4, p, rng)];
  for (int i = 0; i < 4; ++i) {
    const double sigma = std::sqrt(ref[i] * (1 - ref[i]) / draws);
    EXPECT_NEAR(static_cast<double>(counts[i]) / draws, ref[i], 5 * sigma) << i;
  }
}

TEST(Sampling, TemperatureTowardZeroBecomesGreedy) {
  auto logits = test::random_floats(4000, 75, -5.f, 5.f);
  const int32_t best = argmax(logits.data(), 4000);
  logits[best] += 0.01f;  // a known gap: at T = 1e-4 every rival has weight ≤ e^-100
  std::mt19937_64 rng(3);
  for (float t : {1e-4f, 1e-6f})
    for (int i = 0; i < 200; ++i) ASSERT_EQ(sample(logits.data(), 4000, {t, 0, 1.0f}, rng), best);
  std::vector<float> probs(4000);
  sampling_distribution(logits.data(), 4000, {1e-6f, 0, 1.0f}, probs.data());
  EXPECT_EQ(probs[best], 1.0f);
}

TEST(Sampling, SampleFromDistributionSkipsZeros) {
  const float probs[] = {0.0f, 0.0f, 2.0f, 0.0f};  // unnormalised is fine
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(sample_from_distribution(probs, 4, rng), 2);
}

}  // namespace
}  // namespace kiln::cpu
