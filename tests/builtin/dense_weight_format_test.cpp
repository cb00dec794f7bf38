#include "builtin/dense_weight_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "builtin/fake_weight_source.h"
#include "kernels/random_data.h"

namespace kiln::builtin {
namespace {

std::unique_ptr<WeightFormat> make_format() {
  auto f = create_dense_weight_format(CreateContext{});
  EXPECT_TRUE(f.ok());
  return std::move(f).value();
}

TEST(DenseLinear, Bf16ForwardMatchesFp64AndDequantizes) {
  test::FakeWeightSource source;
  for (auto [n, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 3}, {9, 64, 33}, {70, 131, 17}}) {
    const std::string name = "model.layers.0.self_attn.q_a_proj." + std::to_string(in);
    const auto w = source.add(name + ".weight", out, in, test::random_floats(out * in, 81 + in));
    auto format = make_format();
    auto linear = format->load_linear(source, name);
    ASSERT_TRUE(linear.ok()) << linear.status().to_string();
    EXPECT_EQ((*linear)->in_features(), in);
    EXPECT_EQ((*linear)->out_features(), out);

    auto x = test::random_floats(n * in, 82 + n);
    std::vector<float> y(n * out);
    TensorView xv = TensorView::contiguous(x.data(), DType::kF32, {n, in});
    TensorView yv = TensorView::contiguous(y.data(), DType::kF32, {n, out});
    ASSERT_TRUE((*linear)->forward(xv, yv, Stream{}).ok());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < in; ++k) {
          ref += static_cast<double>(x[t * in + k]) * w[o * in + k];
          mag += std::abs(static_cast<double>(x[t * in + k]) * w[o * in + k]);
        }
        ASSERT_NEAR(y[t * out + o], ref, 1e-5 * mag + 1e-30);
      }
    std::vector<float> dq(out * in);
    ASSERT_TRUE((*linear)->dequantize(dq.data()).ok());
    EXPECT_EQ(dq, w);
  }
}

TEST(DenseLinear, ErrorsNameTheTensor) {
  test::FakeWeightSource source;
  auto format = make_format();
  auto missing = format->load_linear(source, "model.layers.3.mlp.down_proj");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("model.layers.3.mlp.down_proj.weight"), std::string::npos);

  std::vector<int8_t> q(12);
  source.add_view("quant.weight", TensorView::contiguous(q.data(), DType::kI8, {3, 4}));
  auto bad_dtype = format->load_linear(source, "quant");
  ASSERT_FALSE(bad_dtype.ok());
  EXPECT_NE(bad_dtype.status().message().find("quant.weight"), std::string::npos);
  EXPECT_NE(bad_dtype.status().message().find("I8"), std::string::npos);

  std::vector<float> v(24);
  source.add_view("vec.weight", TensorView::contiguous(v.data(), DType::kF32, {24}));
  auto bad_rank = format->load_linear(source, "vec");
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_NE(bad_rank.status().message().find("[24]"), std::string::npos);

  source.add("biased.weight", 2, 2, {1, 2, 3, 4});
  source.add("biased.bias", 1, 2, {1, 1});
  EXPECT_EQ(format->load_linear(source, "biased").status().code(), StatusCode::kUnimplemented);

  source.add("ok.weight", 2, 3, {1, 2, 3, 4, 5, 6}, DType::kF32);
  auto linear = format->load_linear(source, "ok");
  ASSERT_TRUE(linear.ok());
  std::vector<float> x(4), y(2);
  TensorView xv = TensorView::contiguous(x.data(), DType::kF32, {1, 4});
  TensorView yv = TensorView::contiguous(y.data(), DType::kF32, {1, 2});
  const Status s = (*linear)->forward(xv, yv, Stream{});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("`ok`"), std::string::npos);
}

struct Experts {
  std::vector<std::vector<float>> gate, up, down;
};

Experts add_experts(test::FakeWeightSource& source, const std::string& prefix, int64_t e_count, int64_t hidden,
                    int64_t inter) {
  Experts ex;
  for (int64_t e = 0; e < e_count; ++e) {
    const std::string base = prefix + "." + std::to_string(e) + ".";
    ex.gate.push_back(source.add(base + "gate_proj.weight", inter, hidden, test::random_floats(inter * hidden, 90 + e)));
    ex.up.push_back(source.add(base + "up_proj.weight", inter, hidden, test::random_floats(inter * hidden, 190 + e)));
    ex.down.push_back(source.add(base + "down_proj.weight", hidden, inter, test::random_floats(hidden * inter, 290 + e)));
  }
  return ex;
}

TEST(DenseExpertSet, MatchesPerTokenReference) {
  const int64_t e_count = 6, hidden = 24, inter = 13, n = 11, top_k = 3;
  test::FakeWeightSource source;
  const auto ex = add_experts(source, "model.layers.1.mlp.experts", e_count, hidden, inter);
  auto format = make_format();
  auto experts = format->load_experts(source, "model.layers.1.mlp.experts", e_count);
  ASSERT_TRUE(experts.ok()) << experts.status().to_string();
  EXPECT_EQ((*experts)->num_experts(), e_count);
  EXPECT_EQ((*experts)->hidden_size(), hidden);
  EXPECT_EQ((*experts)->intermediate_size(), inter);

  auto x = test::random_floats(n * hidden, 91);
  auto weights = test::random_floats(n * top_k, 92, 0.1f, 1.0f);
  std::vector<int32_t> ids(n * top_k);
  for (int64_t j = 0; j < n * top_k; ++j) ids[j] = static_cast<int32_t>((j * 5 + j / top_k) % e_count);
  std::vector<float> y(n * hidden, 123.f);
  TensorView xv = TensorView::contiguous(x.data(), DType::kF32, {n, hidden});
  TensorView yv = TensorView::contiguous(y.data(), DType::kF32, {n, hidden});
  ASSERT_TRUE((*experts)->forward(xv, ids.data(), weights.data(), top_k, yv, Stream{}).ok());

  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> ref(hidden, 0.0);
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = ids[t * top_k + j];
      std::vector<double> act(inter);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          g += static_cast<double>(ex.gate[e][i * hidden + h]) * x[t * hidden + h];
          u += static_cast<double>(ex.up[e][i * hidden + h]) * x[t * hidden + h];
        }
        act[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t h = 0; h < hidden; ++h) {
        double d = 0;
        for (int64_t i = 0; i < inter; ++i) d += ex.down[e][h * inter + i] * act[i];
        ref[h] += weights[t * top_k + j] * d;
      }
    }
    for (int64_t h = 0; h < hidden; ++h) ASSERT_NEAR(y[t * hidden + h], ref[h], 1e-5 * (std::abs(ref[h]) + 1)) << t << "," << h;
  }

  ids[4] = static_cast<int32_t>(e_count);
  const Status bad = (*experts)->forward(xv, ids.data(), weights.data(), top_k, yv, Stream{});
  EXPECT_EQ(bad.code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.message().find("token 1"), std::string::npos);
}

TEST(DenseExpertSet, ErrorsNameMissingOrMisshapenTensor) {
  test::FakeWeightSource source;
  add_experts(source, "mlp.experts", 2, 8, 4);
  auto format = make_format();
  auto missing = format->load_experts(source, "mlp.experts", 3);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("mlp.experts.2.gate_proj.weight"), std::string::npos);

  source.add("mlp.experts.2.gate_proj.weight", 4, 8, test::random_floats(32, 1));
  source.add("mlp.experts.2.up_proj.weight", 4, 8, test::random_floats(32, 2));
  source.add("mlp.experts.2.down_proj.weight", 4, 8, test::random_floats(32, 3));  // should be [8, 4]
  auto misshapen = format->load_experts(source, "mlp.experts", 3);
  ASSERT_FALSE(misshapen.ok());
  EXPECT_NE(misshapen.status().message().find("mlp.experts.2.down_proj.weight"), std::string::npos);
  EXPECT_NE(misshapen.status().message().find("[8, 4]"), std::string::npos);
}

}  // namespace
}  // namespace kiln::builtin
