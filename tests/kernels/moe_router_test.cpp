#include "kernels/cpu/moe_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

// The HF TopkRouter algorithm in fp64 with stable (lower index first) tie-breaking.
void route_ref(const float* logits, const float* bias, const MoeRouterConfig& c, std::vector<int32_t>& ids,
               std::vector<double>& weights) {
  const int64_t e = c.num_experts, gs = e / c.n_group;
  std::vector<double> p(e), choice(e);
  for (int64_t i = 0; i < e; ++i) {
    p[i] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[i])));
    choice[i] = p[i] + (bias ? bias[i] : 0.0);
  }
  std::vector<double> group(c.n_group);
  for (int64_t g = 0; g < c.n_group; ++g) {
    std::vector<double> members(choice.begin() + g * gs, choice.begin() + (g + 1) * gs);
    std::sort(members.rbegin(), members.rend());
    group[g] = members[0] + members[1];
  }
  std::vector<int32_t> gorder(c.n_group);
  std::iota(gorder.begin(), gorder.end(), 0);
  std::stable_sort(gorder.begin(), gorder.end(), [&](int32_t a, int32_t b) { return group[a] > group[b]; });
  std::vector<bool> kept(c.n_group, false);
  for (int64_t j = 0; j < c.topk_group; ++j) kept[gorder[j]] = true;
  std::vector<int32_t> order;
  for (int64_t i = 0; i < e; ++i)
    if (kept[i / gs]) order.push_back(static_cast<int32_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
  ids.assign(order.begin(), order.begin() + c.top_k);
  weights.clear();
  double sum = 0;
  for (int32_t id : ids) sum += p[id];
  for (int32_t id : ids) weights.push_back((c.norm_topk_prob ? p[id] / (sum + 1e-20) : p[id]) * c.routed_scaling_factor);
}

void expect_matches_ref(const MoeRouterConfig& c, int64_t n, bool with_bias, uint64_t seed) {
  auto logits = test::random_floats(n * c.num_experts, seed, -4.f, 4.f);
  auto bias = test::random_floats(c.num_experts, seed + 1, -0.2f, 0.2f);
  std::vector<int32_t> ids(n * c.top_k);
  std::vector<float> weights(n * c.top_k);
  moe_route(logits.data(), with_bias ? bias.data() : nullptr, n, c, ids.data(), weights.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> ref_ids;
    std::vector<double> ref_w;
    route_ref(&logits[t * c.num_experts], with_bias ? bias.data() : nullptr, c, ref_ids, ref_w);
    for (int64_t j = 0; j < c.top_k; ++j) {
      ASSERT_EQ(ids[t * c.top_k + j], ref_ids[j]) << "token " << t << " slot " << j;
      ASSERT_NEAR(weights[t * c.top_k + j], ref_w[j], 1e-6 * std::abs(ref_w[j]) + 1e-7);
    }
  }
}

TEST(MoeRouter, Glm47FlashShape) {
  expect_matches_ref({64, 4, 1, 1, true, 1.8f}, 13, true, 61);
}

TEST(MoeRouter, DeepseekV3GroupLimited) {
  expect_matches_ref({256, 8, 8, 4, true, 2.5f}, 9, true, 62);
  expect_matches_ref({24, 3, 4, 2, false, 1.0f}, 31, false, 63);
  expect_matches_ref({7, 7, 1, 1, true, 1.0f}, 3, true, 64);  // every expert chosen
}

TEST(MoeRouter, GroupLimitExcludesBestSingleExpertOfWeakGroup) {
  // Group 0 = {0, 1}: one strong expert, one very weak: top-2 sum low. Group 1 = {2, 3}: two good experts.
  const MoeRouterConfig c{4, 1, 2, 1, false, 1.0f};
  const float logits[] = {3.0f, -9.0f, 2.0f, 2.0f};
  int32_t id = -1;
  float w = 0;
  moe_route(logits, nullptr, 1, c, &id, &w);
  EXPECT_EQ(id, 2);  // not expert 0, despite the highest score
  EXPECT_NEAR(w, 1.0 / (1.0 + std::exp(-2.0)), 1e-7);
}

TEST(MoeRouter, MarginIsTheSmallestGapToAChoiceLeftOut) {
  // Groups {0, 1} and {2, 3}: group scores s(3)+s(-9) vs s(2)+s(2); within group 1, expert 2 (s(2.1)) beats 3 (s(2)).
  const MoeRouterConfig c{4, 1, 2, 1, false, 1.0f};
  const float logits[] = {3.0f, -9.0f, 2.1f, 2.0f};
  auto s = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  int32_t id = -1;
  float w = 0, margin = 1e9f;
  moe_route(logits, nullptr, 1, c, &id, &w, &margin);
  EXPECT_EQ(id, 2);
  const double group_gap = (s(2.1) + s(2.0)) - (s(3.0) + s(-9.0)), expert_gap = s(2.1) - s(2.0);
  EXPECT_NEAR(margin, std::min(group_gap, expert_gap), 1e-6);
  float tighter = 1e-7f;  // only ever lowered
  moe_route(logits, nullptr, 1, c, &id, &w, &tighter);
  EXPECT_EQ(tighter, 1e-7f);
}

TEST(MoeRouter, BiasChoosesButDoesNotWeigh) {
  const MoeRouterConfig c{4, 2, 1, 1, true, 2.0f};
  const float logits[] = {1.0f, 0.0f, -1.0f, 0.5f};
  const float bias[] = {0.0f, 0.0f, 5.0f, 0.0f};
  int32_t ids[2];
  float w[2];
  moe_route(logits, bias, 1, c, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 0);
  const double p2 = 1 / (1 + std::exp(1.0)), p0 = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(w[0], 2.0 * p2 / (p2 + p0), 1e-6);
  EXPECT_NEAR(w[1], 2.0 * p0 / (p2 + p0), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 2.0, 1e-6);  // normalised, then scaled
}

}  // namespace
}  // namespace kiln::cpu
