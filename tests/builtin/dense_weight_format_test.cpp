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

LinearSpec spec(const std::string& name, int64_t out, int64_t in) {
  LinearSpec s;
  s.names = {name};
  s.out_features = {out};
  s.in_features = in;
  return s;
}

Status run(const Linear& l, float* x, int64_t n, float* y, int64_t in, int64_t out) {
  LinearRun r;
  r.x = TensorView::contiguous(x, DType::kF32, {n, in});
  r.y = TensorView::contiguous(y, DType::kF32, {n, out});
  return l.run(r, Stream{});
}

std::vector<float> dequantized(const Linear& l) {
  std::vector<float> w(l.out_features() * l.in_features());
  EXPECT_TRUE(l.dequantize(TensorView::contiguous(w.data(), DType::kF32, {l.out_features(), l.in_features()}), {}).ok());
  return w;
}

TEST(DenseLinear, Bf16ForwardMatchesFp64AndDequantizes) {
  test::FakeWeightSource source;
  for (auto [n, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 3}, {9, 64, 33}, {70, 131, 17}}) {
    const std::string name = "model.layers.0.self_attn.q_a_proj." + std::to_string(in);
    const auto w = source.add(name + ".weight", out, in, test::random_floats(out * in, 81 + in));
    auto format = make_format();
    auto linear = format->load_linear(source, spec(name, out, in));
    ASSERT_TRUE(linear.ok()) << linear.status().to_string();
    EXPECT_EQ((*linear)->in_features(), in);
    EXPECT_EQ((*linear)->out_features(), out);
    EXPECT_TRUE((*linear)->device().is_cpu());
    EXPECT_EQ((*linear)->dense_weight().data, source.get(name + ".weight")->data) << "a view, not a copy";

    auto x = test::random_floats(n * in, 82 + n);
    std::vector<float> y(n * out);
    ASSERT_TRUE(run(**linear, x.data(), n, y.data(), in, out).ok());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < in; ++k) {
          ref += static_cast<double>(x[t * in + k]) * w[o * in + k];
          mag += std::abs(static_cast<double>(x[t * in + k]) * w[o * in + k]);
        }
        ASSERT_NEAR(y[t * out + o], ref, 1e-5 * mag + 1e-30);
      }
    EXPECT_EQ(dequantized(**linear), w);
  }
}

// Modules stacked along the output dimension (q_a with kv_a, gate with up) compute what each computes alone.
TEST(DenseLinear, StackedModulesConcatenateTheirOutputs) {
  test::FakeWeightSource source;
  const int64_t in = 16, n = 5;
  const auto a = source.add("a.weight", 3, in, test::random_floats(3 * in, 1));
  const auto b = source.add("b.weight", 7, in, test::random_floats(7 * in, 2));
  auto format = make_format();
  LinearSpec both;
  both.names = {"a", "b"};
  both.out_features = {3, 7};
  both.in_features = in;
  auto stacked = format->load_linear(source, both);
  ASSERT_TRUE(stacked.ok()) << stacked.status().to_string();
  EXPECT_EQ((*stacked)->out_features(), 10);
  EXPECT_EQ((*stacked)->dense_weight().data, nullptr) << "two tensors are not one dense matrix";
  auto la = format->load_linear(source, spec("a", 3, in)), lb = format->load_linear(source, spec("b", 7, in));
  ASSERT_TRUE(la.ok() && lb.ok());
  auto x = test::random_floats(n * in, 3);
  std::vector<float> y(n * 10), ya(n * 3), yb(n * 7);
  ASSERT_TRUE(run(**stacked, x.data(), n, y.data(), in, 10).ok());
  ASSERT_TRUE(run(**la, x.data(), n, ya.data(), in, 3).ok());
  ASSERT_TRUE(run(**lb, x.data(), n, yb.data(), in, 7).ok());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t o = 0; o < 3; ++o) EXPECT_EQ(y[t * 10 + o], ya[t * 3 + o]);
    for (int64_t o = 0; o < 7; ++o) EXPECT_EQ(y[t * 10 + 3 + o], yb[t * 7 + o]);
  }
  std::vector<float> w = a;
  w.insert(w.end(), b.begin(), b.end());
  EXPECT_EQ(dequantized(**stacked), w);
  // Each module's shape is checked against its own out_features.
  both.out_features = {3, 6};
  auto wrong = format->load_linear(source, both);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("`b.weight`"), std::string::npos) << wrong.status().message();
  // A synthetic (model.load = "dummy") source is the CUDA half's.
  EXPECT_EQ(format->load_linear(test::SyntheticSourceForTest(), spec("a", 3, in)).status().code(), StatusCode::kUnimplemented);
}

TEST(DenseLinear, ErrorsNameTheTensor) {
  test::FakeWeightSource source;
  auto format = make_format();
  auto missing = format->load_linear(source, spec("model.layers.3.mlp.down_proj", 4, 8));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("model.layers.3.mlp.down_proj.weight"), std::string::npos);

  std::vector<int8_t> q(12);
  source.add_view("quant.weight", TensorView::contiguous(q.data(), DType::kI8, {3, 4}));
  auto bad_dtype = format->load_linear(source, spec("quant", 3, 4));
  ASSERT_FALSE(bad_dtype.ok());
  EXPECT_NE(bad_dtype.status().message().find("quant.weight"), std::string::npos);
  EXPECT_NE(bad_dtype.status().message().find("I8"), std::string::npos);

  std::vector<float> v(24);
  source.add_view("vec.weight", TensorView::contiguous(v.data(), DType::kF32, {24}));
  auto bad_rank = format->load_linear(source, spec("vec", 24, 1));
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_NE(bad_rank.status().message().find("[24]"), std::string::npos);

  source.add("biased.weight", 2, 2, {1, 2, 3, 4});
  source.add("biased.bias", 1, 2, {1, 1});
  EXPECT_EQ(format->load_linear(source, spec("biased", 2, 2)).status().code(), StatusCode::kUnimplemented);

  source.add("ok.weight", 2, 3, {1, 2, 3, 4, 5, 6}, DType::kF32);
  auto linear = format->load_linear(source, spec("ok", 2, 3));
  ASSERT_TRUE(linear.ok());
  std::vector<float> x(4), y(2);
  const Status s = run(**linear, x.data(), 1, y.data(), 4, 2);
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
  auto experts = format->load_experts(source, {"model.layers.1.mlp.experts", e_count, hidden, inter});
  ASSERT_TRUE(experts.ok()) << experts.status().to_string();
  EXPECT_EQ((*experts)->num_experts(), e_count);
  EXPECT_EQ((*experts)->hidden_size(), hidden);
  EXPECT_EQ((*experts)->intermediate_size(), inter);

  auto x = test::random_floats(n * hidden, 91);
  auto weights = test::random_floats(n * top_k, 92, 0.1f, 1.0f);
  std::vector<int32_t> ids(n * top_k);
  for (int64_t j = 0; j < n * top_k; ++j) ids[j] = static_cast<int32_t>((j * 5 + j / top_k) % e_count);
  std::vector<float> pairs(n * top_k * hidden, 123.f);
  ExpertRun r;
  r.x = TensorView::contiguous(x.data(), DType::kF32, {n, hidden});
  r.routing.top_k = static_cast<int>(top_k);
  r.routing.ids = ids.data();
  r.routing.weights = weights.data();
  r.pair_out = pairs.data();
  auto folded = (*experts)->run(r, Stream{});
  ASSERT_TRUE(folded.ok()) << folded.status().to_string();
  EXPECT_FALSE(*folded) << "the CPU set leaves the shared expert to the caller";
  // A token's output is the sum of its pairs' (each already weighted).
  std::vector<float> y(n * hidden, 0.f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < top_k; ++j)
      for (int64_t h = 0; h < hidden; ++h) y[t * hidden + h] += pairs[(t * top_k + j) * hidden + h];

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
  const Status bad = (*experts)->run(r, Stream{}).status();
  EXPECT_EQ(bad.code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.message().find("token 1"), std::string::npos);
}

TEST(DenseExpertSet, ErrorsNameMissingOrMisshapenTensor) {
  test::FakeWeightSource source;
  add_experts(source, "mlp.experts", 2, 8, 4);
  auto format = make_format();
  auto missing = format->load_experts(source, {"mlp.experts", 3, 8, 4});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("mlp.experts.2.gate_proj.weight"), std::string::npos);

  source.add("mlp.experts.2.gate_proj.weight", 4, 8, test::random_floats(32, 1));
  source.add("mlp.experts.2.up_proj.weight", 4, 8, test::random_floats(32, 2));
  source.add("mlp.experts.2.down_proj.weight", 4, 8, test::random_floats(32, 3));  // should be [8, 4]
  auto misshapen = format->load_experts(source, {"mlp.experts", 3, 8, 4});
  ASSERT_FALSE(misshapen.ok());
  EXPECT_NE(misshapen.status().message().find("mlp.experts.2.down_proj.weight"), std::string::npos);
  EXPECT_NE(misshapen.status().message().find("[8, 4]"), std::string::npos);
}

}  // namespace
}  // namespace kiln::builtin
