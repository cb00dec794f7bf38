#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

constexpr float kRelTol = 2e-6f;

double rms_ref(const float* x, int64_t dim, double eps) {
  double s = 0;
  for (int64_t i = 0; i < dim; ++i) s += static_cast<double>(x[i]) * x[i];
  return 1.0 / std::sqrt(s / dim + eps);
}

class NormTest : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(NormTest, RmsnormMatchesFp64) {
  const auto [n, dim] = GetParam();
  auto x = test::random_floats(n * dim, 1 + dim, -3.f, 3.f);
  auto w = test::random_floats(dim, 2 + dim, 0.5f, 1.5f);
  std::vector<float> out(n * dim);
  rmsnorm(x.data(), w.data(), n, dim, 1e-5f, out.data());
  for (int64_t t = 0; t < n; ++t) {
    const double inv = rms_ref(&x[t * dim], dim, 1e-5);
    for (int64_t i = 0; i < dim; ++i) {
      const double ref = x[t * dim + i] * inv * w[i];
      ASSERT_NEAR(out[t * dim + i], ref, kRelTol * std::abs(ref) + 1e-7);
    }
  }
}

TEST_P(NormTest, AddRmsnormUpdatesResidual) {
  const auto [n, dim] = GetParam();
  auto x = test::random_floats(n * dim, 3 + dim);
  auto residual = test::random_floats(n * dim, 4 + dim);
  const auto original = residual;
  auto w = test::random_floats(dim, 5 + dim, 0.5f, 1.5f);
  std::vector<float> out(n * dim);
  add_rmsnorm(x.data(), residual.data(), w.data(), n, dim, 1e-6f, out.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> sum(dim);
    for (int64_t i = 0; i < dim; ++i) {
      sum[i] = x[t * dim + i] + original[t * dim + i];
      ASSERT_EQ(residual[t * dim + i], sum[i]);
    }
    const double inv = rms_ref(sum.data(), dim, 1e-6);
    for (int64_t i = 0; i < dim; ++i) {
      const double ref = sum[i] * inv * w[i];
      ASSERT_NEAR(out[t * dim + i], ref, kRelTol * std::abs(ref) + 1e-7);
    }
  }
}

TEST_P(NormTest, LayernormMatchesFp64) {
  const auto [n, dim] = GetParam();
  auto x = test::random_floats(n * dim, 6 + dim, -2.f, 4.f);
  auto w = test::random_floats(dim, 7 + dim);
  auto b = test::random_floats(dim, 8 + dim);
  std::vector<float> out(n * dim);
  layernorm(x.data(), w.data(), b.data(), n, dim, 1e-6f, out.data());
  for (int64_t t = 0; t < n; ++t) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < dim; ++i) mean += x[t * dim + i];
    mean /= dim;
    for (int64_t i = 0; i < dim; ++i) var += (x[t * dim + i] - mean) * (x[t * dim + i] - mean);
    var /= dim;
    for (int64_t i = 0; i < dim; ++i) {
      const double ref = (x[t * dim + i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i];
      ASSERT_NEAR(out[t * dim + i], ref, 4e-6 * (std::abs(ref) + 1.0));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, NormTest,
                         ::testing::Values(std::make_pair(1, 1), std::make_pair(3, 7), std::make_pair(5, 64),
                                           std::make_pair(9, 513), std::make_pair(40, 2048)));

TEST(Activation, SigmoidSiluMatchFp64) {
  for (int64_t count : {1, 17, 100001}) {
    auto x = test::random_floats(count, 9 + count, -30.f, 30.f);
    std::vector<float> s(count), si(count);
    sigmoid(x.data(), count, s.data());
    silu(x.data(), count, si.data());
    for (int64_t i = 0; i < count; ++i) {
      const double ref = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
      ASSERT_NEAR(s[i], ref, 2e-7 * ref + 1e-30);
      ASSERT_NEAR(si[i], x[i] * ref, 3e-7 * std::abs(x[i] * ref) + 1e-30);
    }
  }
}

TEST(Activation, SwigluHalvesAndSeparateBuffersWithLimit) {
  const int64_t n = 5, inter = 37;
  auto gate_up = test::random_floats(n * 2 * inter, 10, -15.f, 15.f);
  std::vector<float> fused(n * inter), split(n * inter), clamped(n * inter);
  swiglu(gate_up.data(), gate_up.data() + inter, n, inter, 2 * inter, fused.data());
  std::vector<float> gate(n * inter), up(n * inter);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      gate[t * inter + i] = gate_up[t * 2 * inter + i];
      up[t * inter + i] = gate_up[t * 2 * inter + inter + i];
    }
  swiglu(gate.data(), up.data(), n, inter, inter, split.data());
  swiglu(gate.data(), up.data(), n, inter, inter, clamped.data(), 10.0f);
  for (int64_t j = 0; j < n * inter; ++j) {
    const double g = gate[j], u = up[j];
    const double ref = g / (1.0 + std::exp(-g)) * u;
    ASSERT_NEAR(fused[j], ref, 1e-6 * std::abs(ref) + 1e-12);
    ASSERT_EQ(fused[j], split[j]);
    const double gc = std::min(g, 10.0), uc = std::clamp(u, -10.0, 10.0);
    const double ref_c = gc / (1.0 + std::exp(-gc)) * uc;
    ASSERT_NEAR(clamped[j], ref_c, 1e-6 * std::abs(ref_c) + 1e-12);
  }
}

TEST(Activation, SoftmaxStableAndHandlesMaskedRows) {
  for (int64_t dim : {1, 3, 1000}) {
    auto x = test::random_floats(4 * dim, 11 + dim, -5.f, 5.f);
    for (int64_t i = 0; i < dim; ++i) x[dim + i] += 1e4f;  // row 1: huge values must not overflow
    for (int64_t i = 0; i < dim; ++i) x[2 * dim + i] = -std::numeric_limits<float>::infinity();
    x[3 * dim] = -std::numeric_limits<float>::infinity();  // row 3: one masked entry
    std::vector<float> out(4 * dim);
    softmax(x.data(), 4, dim, out.data());
    for (int row : {0, 1, 3}) {
      double max_v = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t i = 0; i < dim; ++i) max_v = std::max(max_v, static_cast<double>(x[row * dim + i]));
      if (std::isinf(max_v)) continue;
      for (int64_t i = 0; i < dim; ++i) sum += std::exp(x[row * dim + i] - max_v);
      for (int64_t i = 0; i < dim; ++i) {
        const double ref = std::exp(x[row * dim + i] - max_v) / sum;
        ASSERT_NEAR(out[row * dim + i], ref, 1e-6 * ref + 1e-12) << "row " << row;
      }
    }
    for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(out[2 * dim + i], 0.0f);
    EXPECT_EQ(out[3 * dim], 0.0f);
  }
}

}  // namespace
}  // namespace kiln::cpu
