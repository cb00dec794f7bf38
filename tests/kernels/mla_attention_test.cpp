#include "kernels/cpu/mla_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "kernels/cpu/half_float.h"
#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

// fp64 causal attention; `visible(i, t)` decides which keys query i may use.
template <class Visible>
std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                  int64_t t_q, int64_t t_kv, int64_t heads, int64_t qk, int64_t vd, double scale,
                                  Visible visible) {
  std::vector<double> out(t_q * heads * vd, 0.0);
  for (int64_t i = 0; i < t_q; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> s;
      std::vector<int64_t> keys;
      for (int64_t t = 0; t < t_kv; ++t) {
        if (t > t_kv - t_q + i || !visible(i, t)) continue;
        double d = 0;
        for (int64_t c = 0; c < qk; ++c) d += static_cast<double>(q[(i * heads + h) * qk + c]) * k[(t * heads + h) * qk + c];
        s.push_back(d * scale);
        keys.push_back(t);
      }
      if (keys.empty()) continue;
      double m = -1e300, z = 0;
      for (double x : s) m = std::max(m, x);
      for (double& x : s) z += (x = std::exp(x - m));
      for (size_t j = 0; j < keys.size(); ++j)
        for (int64_t c = 0; c < vd; ++c) out[(i * heads + h) * vd + c] += s[j] / z * v[(keys[j] * heads + h) * vd + c];
    }
  return out;
}

struct Shape {
  int64_t t_q, t_kv, heads, qk, vd;
};

class ExpandedTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ExpandedTest, CausalWithOffsetMatchesFp64) {
  const Shape s = GetParam();
  auto q = test::random_floats(s.t_q * s.heads * s.qk, 31, -2.f, 2.f);
  auto k = test::random_floats(s.t_kv * s.heads * s.qk, 32, -2.f, 2.f);
  auto v = test::random_floats(s.t_kv * s.heads * s.vd, 33);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.qk));
  std::vector<float> out(s.t_q * s.heads * s.vd);
  mla_attention_expanded(q.data(), k.data(), v.data(), s.t_q, s.t_kv, s.heads, s.qk, s.vd, scale, nullptr, 0,
                         out.data());
  const auto ref = attention_ref(q, k, v, s.t_q, s.t_kv, s.heads, s.qk, s.vd, scale, [](int64_t, int64_t) { return true; });
  for (size_t j = 0; j < out.size(); ++j) ASSERT_NEAR(out[j], ref[j], 2e-6) << j;
}

TEST_P(ExpandedTest, SelectedKeysRestrictVisibility) {
  const Shape s = GetParam();
  auto q = test::random_floats(s.t_q * s.heads * s.qk, 34, -2.f, 2.f);
  auto k = test::random_floats(s.t_kv * s.heads * s.qk, 35, -2.f, 2.f);
  auto v = test::random_floats(s.t_kv * s.heads * s.vd, 36);
  // Per query: a pseudo-random subset, a duplicate, a future (non-causal) position and −1 padding.
  const int64_t width = 6;
  std::vector<int32_t> selected(s.t_q * width, -1);
  std::vector<std::set<int64_t>> chosen(s.t_q);
  for (int64_t i = 0; i < s.t_q; ++i) {
    const int64_t pos = s.t_kv - s.t_q + i;
    selected[i * width + 0] = static_cast<int32_t>((i * 7) % (pos + 1));
    selected[i * width + 1] = static_cast<int32_t>(pos);
    selected[i * width + 2] = static_cast<int32_t>(pos);  // duplicate
    selected[i * width + 3] = static_cast<int32_t>(pos + 1);  // beyond the causal limit (ignored when it exists)
    for (int j = 0; j < 3; ++j) chosen[i].insert(selected[i * width + j]);
  }
  const float scale = 0.1f;
  std::vector<float> out(s.t_q * s.heads * s.vd);
  mla_attention_expanded(q.data(), k.data(), v.data(), s.t_q, s.t_kv, s.heads, s.qk, s.vd, scale, selected.data(),
                         width, out.data());
  const auto ref = attention_ref(q, k, v, s.t_q, s.t_kv, s.heads, s.qk, s.vd, scale,
                                 [&](int64_t i, int64_t t) { return chosen[i].count(t) != 0; });
  for (size_t j = 0; j < out.size(); ++j) ASSERT_NEAR(out[j], ref[j], 2e-6) << j;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ExpandedTest,
                         ::testing::Values(Shape{1, 1, 1, 1, 1}, Shape{3, 3, 2, 5, 3}, Shape{4, 11, 3, 24, 16},
                                           Shape{17, 17, 4, 72, 64}, Shape{1, 130, 2, 96, 33}));

TEST(MlaAttention, NoVisibleKeyGivesZeros) {
  std::vector<float> q(8, 1.f), k(16, 1.f), v(16, 3.f), out(8, 7.f);
  const int32_t selected[2] = {-1, -1};
  mla_attention_expanded(q.data(), k.data(), v.data(), 1, 2, 2, 4, 4, 1.f, selected, 2, out.data());
  for (float o : out) EXPECT_EQ(o, 0.f);
}

// Absorbed decode (q̃ = q_nope·W_UK, attention over [c, k_pe] in a bf16 cache, o = W_UV·o_lat) equals the
// expanded attention with k = [c·W_UKᵀ, k_pe], v = c·W_UVᵀ computed from the same (bf16-rounded) cache.
TEST(MlaAttention, AbsorbedEqualsExpanded) {
  const int64_t heads = 3, nope = 24, rope = 8, vd = 20, latent = 40, t_kv = 19, t_q = 4;
  const MlaAbsorbDims dims{heads, nope, vd, latent};
  auto kv_b = test::random_floats(heads * (nope + vd) * latent, 41, -0.3f, 0.3f);
  auto c = test::random_floats(t_kv * latent, 42);
  auto k_pe = test::random_floats(t_kv * rope, 43);
  auto q = test::random_floats(t_q * heads * (nope + rope), 44);
  for (auto& x : c) x = bf16_to_float(float_to_bf16(x));
  for (auto& x : k_pe) x = bf16_to_float(float_to_bf16(x));
  const float scale = 0.17f;

  // Expanded.
  std::vector<float> k(t_kv * heads * (nope + rope)), v(t_kv * heads * vd);
  for (int64_t t = 0; t < t_kv; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t r = 0; r < nope + vd; ++r) {
        double acc = 0;
        for (int64_t l = 0; l < latent; ++l) acc += static_cast<double>(kv_b[(h * (nope + vd) + r) * latent + l]) * c[t * latent + l];
        if (r < nope) k[(t * heads + h) * (nope + rope) + r] = static_cast<float>(acc);
        else v[(t * heads + h) * vd + (r - nope)] = static_cast<float>(acc);
      }
      for (int64_t r = 0; r < rope; ++r) k[(t * heads + h) * (nope + rope) + nope + r] = k_pe[t * rope + r];
    }
  std::vector<float> expanded(t_q * heads * vd);
  mla_attention_expanded(q.data(), k.data(), v.data(), t_q, t_kv, heads, nope + rope, vd, scale, nullptr, 0,
                         expanded.data());

  // Absorbed: cache rows [c, k_pe] in bf16, stored at shuffled slots.
  const int64_t row = latent + rope;
  std::vector<uint16_t> cache(2 * t_kv * row);
  std::vector<int64_t> slot_of(t_kv);
  for (int64_t t = 0; t < t_kv; ++t) {
    slot_of[t] = (t * 5 + 3) % (2 * t_kv);
    for (int64_t l = 0; l < latent; ++l) cache[slot_of[t] * row + l] = float_to_bf16(c[t * latent + l]);
    for (int64_t r = 0; r < rope; ++r) cache[slot_of[t] * row + latent + r] = float_to_bf16(k_pe[t * rope + r]);
  }
  std::vector<float> q_abs(t_q * heads * row);
  mla_absorb_query(q.data(), t_q, nope + rope, kv_b.data(), dims, q_abs.data(), row);
  for (int64_t th = 0; th < t_q * heads; ++th)
    for (int64_t r = 0; r < rope; ++r) q_abs[th * row + latent + r] = q[th * (nope + rope) + nope + r];
  std::vector<float> o_lat(t_q * heads * latent), scratch(heads * t_kv + row);
  for (int64_t i = 0; i < t_q; ++i) {
    const int64_t visible = t_kv - t_q + i + 1;
    mla_attention_absorbed_bf16(q_abs.data() + i * heads * row, heads, latent, rope, cache.data(), slot_of.data(),
                                visible, scale, o_lat.data() + i * heads * latent, scratch.data());
  }
  std::vector<float> absorbed(t_q * heads * vd);
  mla_unabsorb_output(o_lat.data(), t_q, kv_b.data(), dims, absorbed.data());
  for (size_t j = 0; j < absorbed.size(); ++j) ASSERT_NEAR(absorbed[j], expanded[j], 1e-5) << j;
}

TEST(MlaAttention, AbsorbHelpersMatchFp64) {
  const int64_t n = 3, heads = 2, nope = 5, vd = 7, latent = 33;
  const MlaAbsorbDims dims{heads, nope, vd, latent};
  auto kv_b = test::random_floats(heads * (nope + vd) * latent, 45);
  auto q_nope = test::random_floats(n * heads * nope, 46);
  auto o_lat = test::random_floats(n * heads * latent, 47);
  std::vector<float> q_lat(n * heads * latent), o(n * heads * vd);
  mla_absorb_query(q_nope.data(), n, nope, kv_b.data(), dims, q_lat.data(), latent);
  mla_unabsorb_output(o_lat.data(), n, kv_b.data(), dims, o.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t l = 0; l < latent; ++l) {
        double ref = 0;
        for (int64_t d = 0; d < nope; ++d)
          ref += static_cast<double>(q_nope[(t * heads + h) * nope + d]) * kv_b[(h * (nope + vd) + d) * latent + l];
        ASSERT_NEAR(q_lat[(t * heads + h) * latent + l], ref, 1e-6);
      }
      for (int64_t r = 0; r < vd; ++r) {
        double ref = 0;
        for (int64_t l = 0; l < latent; ++l)
          ref += static_cast<double>(kv_b[(h * (nope + vd) + nope + r) * latent + l]) * o_lat[(t * heads + h) * latent + l];
        ASSERT_NEAR(o[(t * heads + h) * vd + r], ref, 1e-5);
      }
    }
}

}  // namespace
}  // namespace kiln::cpu
