// The CPU KDA kernels: the recurrence on a case worked by hand, the chunked (WY) form equal to the recurrence
// across chunk boundaries, state carried between calls, the short conv's history, the gates.
#include "kernels/cpu/kda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "random_data.h"

namespace kiln::cpu {
namespace {

using test::random_floats;

TEST(KdaTest, RecurrenceMatchesAWorkedExample) {
  // One head, dk = dv = 1, β = 1. Token 1: no decay, v = 2 → S = 2k̂, o = 2k̂q̂. Token 2: decay ½, v = 3 →
  // S = k̂ + (3 − k̂²)k̂, o = S q̂; k̂ = q̂ = 1 / sqrt(1 + 1e-6).
  std::vector<float> q = {1, 1}, k = {1, 1}, v = {2, 3}, g = {0, std::log(0.5f)}, beta = {1, 1}, state = {0}, out(2);
  kda_normalize_qk(q.data(), k.data(), 2, 1, 1);
  const float kh = 1.0f / std::sqrt(1.0f + 1e-6f);
  EXPECT_NEAR(k[0], kh, 1e-7);
  kda_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), 2, 1, 1, 1, state.data(), out.data());
  EXPECT_NEAR(out[0], 2 * kh * kh, 1e-6);
  const float s2 = kh + (3 - kh * kh) * kh;
  EXPECT_NEAR(state[0], s2, 1e-6);
  EXPECT_NEAR(out[1], s2 * kh, 1e-6);
}

struct KdaInputs {
  std::vector<float> q, k, v, g, beta, state;
};

KdaInputs random_inputs(int64_t t, int64_t heads, int64_t dk, int64_t dv, uint64_t seed, bool bounded) {
  KdaInputs in;
  in.q = random_floats(t * heads * dk, seed);
  in.k = random_floats(t * heads * dk, seed + 1);
  in.v = random_floats(t * heads * dv, seed + 2);
  in.g = random_floats(t * heads * dk, seed + 3, -3.0f, 3.0f);
  std::vector<float> a_log = random_floats(heads, seed + 4, -1.0f, 0.5f);
  kda_forget_gate(in.g.data(), t, heads, dk, a_log.data(), bounded, -5.0f);
  in.beta = random_floats(t * heads, seed + 5, 0.0f, 1.0f);
  in.state = random_floats(heads * dk * dv, seed + 6, -0.5f, 0.5f);
  kda_normalize_qk(in.q.data(), in.k.data(), t, heads, dk);
  return in;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(KdaTest, ChunkedFormEqualsTheRecurrenceAcrossChunkBoundaries) {
  for (bool bounded : {true, false})
    for (int64_t t : {1, 5, 16, 17, 64, 65, 150})
      for (int64_t chunk : {16, 64}) {
        const int64_t H = 3, dk = 8, dv = 12;
        KdaInputs in = random_inputs(t, H, dk, dv, 100 + t, bounded);
        std::vector<float> s_rec = in.state, s_chk = in.state, o_rec(t * H * dv), o_chk(t * H * dv);
        kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), t, H, dk, dv, s_rec.data(),
                      o_rec.data());
        kda_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), t, H, dk, dv, chunk,
                    s_chk.data(), o_chk.data());
        // fp32, outputs O(1): the forms differ by summation order only.
        EXPECT_LT(max_abs_diff(o_rec, o_chk), 2e-5) << "t=" << t << " chunk=" << chunk << " bounded=" << bounded;
        EXPECT_LT(max_abs_diff(s_rec, s_chk), 2e-5) << "t=" << t << " chunk=" << chunk << " bounded=" << bounded;
      }
}

TEST(KdaTest, StateCarriesBetweenCalls) {
  const int64_t t = 70, split = 23, H = 2, dk = 16, dv = 8;
  KdaInputs in = random_inputs(t, H, dk, dv, 7, true);
  std::vector<float> s_one = in.state, s_two = in.state, o_one(t * H * dv), o_two(t * H * dv);
  kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), t, H, dk, dv, s_one.data(),
                o_one.data());
  // The recurrence split in two calls is the same arithmetic: bit-identical.
  kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), split, H, dk, dv, s_two.data(),
                o_two.data());
  kda_recurrent(in.q.data() + split * H * dk, in.k.data() + split * H * dk, in.v.data() + split * H * dv,
                in.g.data() + split * H * dk, in.beta.data() + split * H, t - split, H, dk, dv, s_two.data(),
                o_two.data() + split * H * dv);
  EXPECT_EQ(o_one, o_two);
  EXPECT_EQ(s_one, s_two);
  // The chunked form continuing from a stored state.
  std::vector<float> s_chk = in.state, o_chk(t * H * dv);
  kda_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), split, H, dk, dv, 64, s_chk.data(),
              o_chk.data());
  kda_chunked(in.q.data() + split * H * dk, in.k.data() + split * H * dk, in.v.data() + split * H * dv,
              in.g.data() + split * H * dk, in.beta.data() + split * H, t - split, H, dk, dv, 64, s_chk.data(),
              o_chk.data() + split * H * dv);
  EXPECT_LT(max_abs_diff(o_one, o_chk), 2e-5);
  EXPECT_LT(max_abs_diff(s_one, s_chk), 2e-5);
}

TEST(KdaTest, ShortConvReadsItsHistoryAndKeepsTheLastInputs) {
  // Two channels, width 4: out[t] = silu(Σ_j w[j] · in[t − 3 + j]) with the history before t = 0.
  const int64_t C = 2, W = 4;
  std::vector<float> w = {1, 2, 3, 4, 0.5f, 0, 0, -1};
  std::vector<float> history = {1, 10, 2, 20, 3, 30};  // [3, C], oldest first
  std::vector<float> in = {4, 40, 5, 50};               // [2, C]
  std::vector<float> state = history, out(4);
  kda_short_conv_silu(in.data(), 2, C, w.data(), W, state.data(), out.data());
  auto silu = [](float x) { return x / (1 + std::exp(-x)); };
  EXPECT_NEAR(out[0], silu(1 * 1 + 2 * 2 + 3 * 3 + 4 * 4), 1e-4);
  EXPECT_NEAR(out[1], silu(0.5f * 10 - 40), 1e-5);
  EXPECT_NEAR(out[2], silu(1 * 2 + 2 * 3 + 3 * 4 + 4 * 5), 1e-4);
  EXPECT_NEAR(out[3], silu(0.5f * 20 - 50), 1e-5);
  EXPECT_EQ(state, (std::vector<float>{3, 30, 4, 40, 5, 50}));
  // One token at a time from the same history gives the same outputs.
  std::vector<float> s2 = history, o2(4);
  kda_short_conv_silu(in.data(), 1, C, w.data(), W, s2.data(), o2.data());
  kda_short_conv_silu(in.data() + C, 1, C, w.data(), W, s2.data(), o2.data() + C);
  EXPECT_EQ(o2, out);
  EXPECT_EQ(s2, state);
}

TEST(KdaTest, ForgetGateIsBoundedOrSoftplus) {
  std::vector<float> g = {-100, 0, 100, 30};
  const float a_log = std::log(2.0f);
  std::vector<float> bounded = g;
  kda_forget_gate(bounded.data(), 1, 1, 4, &a_log, true, -5.0f);
  EXPECT_NEAR(bounded[0], 0.0f, 1e-6);
  EXPECT_NEAR(bounded[1], -2.5f, 1e-6);
  EXPECT_NEAR(bounded[2], -5.0f, 1e-6);
  std::vector<float> legacy = g;
  kda_forget_gate(legacy.data(), 1, 1, 4, &a_log, false, 0.0f);
  EXPECT_NEAR(legacy[1], -2.0f * std::log(2.0f), 1e-6);
  EXPECT_NEAR(legacy[3], -60.0f, 1e-4);  // softplus(x) = x above 20
}

TEST(KdaTest, GatedRmsNormScalesEachHead) {
  // Head values (3, 4): mean square 12.5; gate 0 halves.
  std::vector<float> o = {3, 4, 3, 4}, gate = {0, 0, 100, 100}, w = {1, 2}, y(4);
  kda_gated_rmsnorm(o.data(), gate.data(), w.data(), 1, 2, 2, 0.0f, y.data());
  const float inv = 1.0f / std::sqrt(12.5f);
  EXPECT_NEAR(y[0], 3 * inv * 0.5f, 1e-6);
  EXPECT_NEAR(y[1], 2 * 4 * inv * 0.5f, 1e-6);
  EXPECT_NEAR(y[2], 3 * inv, 1e-6);
  EXPECT_NEAR(y[3], 2 * 4 * inv, 1e-6);
}

}  // namespace
}  // namespace kiln::cpu
