// The reader and the CPU reference: y = x·Wᵀ through the trellis equals the dense matmul with dequantize()'s W for
// every K and codebook, padded shapes, legacy sign vectors, biases, stacked and mixed (EXL3 + dense) modules,
// experts; loader errors name the tensor.
#include <gtest/gtest.h>

#include <cmath>

#include "exl3_cpu_linear.h"
#include "exl3_module.h"
#include "exl3_test_source.h"
#include "exl3_tile.h"

namespace kiln::exl3 {
namespace {

using test::MemorySource;
using test::ModuleOptions;

std::vector<float> run_linear(const Linear& l, const std::vector<float>& x, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n * l.out_features()), -1.0f);
  LinearRun r;
  r.x = TensorView::contiguous(const_cast<float*>(x.data()), DType::kF32, {n, l.in_features()});
  r.y = TensorView::contiguous(y.data(), DType::kF32, {n, l.out_features()});
  EXPECT_TRUE(l.run(r, {}).ok());
  return y;
}

std::vector<float> dense_weight(const Linear& l) {
  std::vector<float> w(static_cast<size_t>(l.out_features() * l.in_features()));
  const Status s = l.dequantize(TensorView::contiguous(w.data(), DType::kF32, {l.out_features(), l.in_features()}), {});
  EXPECT_TRUE(s.ok()) << s.to_string();
  return w;
}

// max |y − x·Wᵀ| relative to the largest |y|: the two sides sum in different orders in fp32.
void expect_matches_dense(const Linear& l, const std::vector<float>& bias, int64_t n, uint32_t seed,
                          const std::string& what) {
  const int64_t in = l.in_features(), out = l.out_features();
  const auto x = test::random_floats(n * in, seed);
  const auto y = run_linear(l, x, n);
  const auto w = dense_weight(l);
  double err = 0, mag = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double ref = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < in; ++i) ref += static_cast<double>(x[r * in + i]) * w[o * in + i];
      err = std::max(err, std::abs(ref - y[r * out + o]));
      mag = std::max(mag, std::abs(ref));
    }
  EXPECT_GT(mag, 0.0) << what;
  EXPECT_LT(err, 2e-5 * mag + 1e-6) << what << ": max error " << err << " of " << mag;
}

LinearSpec spec(std::vector<std::string> names, std::vector<int64_t> outs, int64_t in) {
  LinearSpec s;
  s.names = std::move(names);
  s.out_features = std::move(outs);
  s.in_features = in;
  return s;
}

Result<std::unique_ptr<Linear>> load(const WeightSource& source, const LinearSpec& s) {
  std::vector<Part> parts;
  for (size_t i = 0; i < s.names.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Part p, read_part(source, s.names[i], s.in_features, s.out_features[i]));
    parts.push_back(std::move(p));
  }
  return make_cpu_linear(std::move(parts), s.in_features);
}

TEST(Exl3Linear, ForwardEqualsDequantizedMatmulForEveryKAndCodebook) {
  for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1})
    for (int bits = 1; bits <= kMaxBits; ++bits) {
      MemorySource source;
      ModuleOptions o;
      o.bits = bits;
      o.codebook = cb;
      add_random_module(source, "m", 128, 256, o, 100 + bits);
      auto l = load(source, spec({"m"}, {256}, 128));
      ASSERT_TRUE(l.ok()) << l.status().to_string();
      expect_matches_dense(**l, {}, 3, 7 + bits, std::string(codebook_name(cb)) + " K" + std::to_string(bits));
    }
}

TEST(Exl3Linear, PaddedShapesLegacySignsAndBias) {
  struct Case {
    int64_t in, out;
    ModuleOptions o;
  };
  std::vector<Case> cases(4);
  cases[0] = {200, 72, {}};  // in 200 → 256, out 72 → 128
  cases[1] = {200, 72, {}};
  cases[1].o.legacy_signs = true;
  cases[1].o.bits = 2;
  cases[2] = {130, 300, {}};
  cases[2].o.bias = true;
  cases[2].o.codebook = Codebook::kMul1;
  cases[3] = {384, 16, {}};
  cases[3].o.bits = 6;
  cases[3].o.codebook = Codebook::kMcg;
  for (size_t c = 0; c < cases.size(); ++c) {
    MemorySource source;
    const auto& [in, out, o] = cases[c];
    add_random_module(source, "m", in, out, o, 40 + c);
    auto l = load(source, spec({"m"}, {out}, in));
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    EXPECT_EQ((*l)->in_features(), in);
    EXPECT_EQ((*l)->out_features(), out);
    std::vector<float> bias;
    if (o.bias) {
      const auto t = source.get("m.bias");
      for (int64_t i = 0; i < out; ++i) bias.push_back(half_to_float(t->as<const uint16_t>()[i]));
    }
    for (int64_t n : {1, 5}) expect_matches_dense(**l, bias, n, 90 + n, "case " + std::to_string(c));
  }
}

TEST(Exl3Linear, DequantizeIsTheDefinition) {
  // W = (diag(suh)·Hb·Ŵ·Hb·diag(svh))ᵀ built element by element from the decoded matrix and explicit H entries.
  MemorySource source;
  add_random_module(source, "m", 128, 128, {}, 5);
  auto m = read_module(source, "m", 128, 128);
  ASSERT_TRUE(m.ok());
  const auto what = decode_matrix(*m);
  const auto w = dequantize(*m);
  auto h = [](int a, int b) { return (__builtin_popcount(a & b) % 2 ? -1.0 : 1.0) / std::sqrt(128.0); };
  std::vector<double> hw(128 * 128, 0.0);  // H·Ŵ
  for (int a = 0; a < 128; ++a)
    for (int k = 0; k < 128; ++k)
      for (int c = 0; c < 128; ++c) hw[a * 128 + c] += h(a, k) * what[k * 128 + c];
  for (int i : {0, 3, 77, 127})
    for (int o : {0, 1, 64, 127}) {
      double v = 0;
      for (int c = 0; c < 128; ++c) v += hw[i * 128 + c] * h(c, o);
      v *= m->suh[i] * m->svh[o];
      EXPECT_NEAR(w[o * 128 + i], v, 1e-5) << i << "," << o;
    }
}

TEST(Exl3Linear, BatchInvariantRows) {
  MemorySource source;
  add_random_module(source, "m", 256, 128, {}, 9);
  auto l = load(source, spec({"m"}, {128}, 256));
  ASSERT_TRUE(l.ok());
  const auto x = test::random_floats(7 * 256, 3);
  const auto all = run_linear(**l, x, 7);
  const std::vector<float> row(x.begin() + 3 * 256, x.begin() + 4 * 256);
  const auto one = run_linear(**l, row, 1);
  for (int o = 0; o < 128; ++o) EXPECT_EQ(one[o], all[3 * 128 + o]);
}

TEST(Exl3Linear, StacksExl3AndDenseModules) {
  MemorySource source;
  ModuleOptions mul1;
  mul1.codebook = Codebook::kMul1;
  add_random_module(source, "gate_proj", 200, 96, mul1, 1);
  add_random_module(source, "up_proj", 200, 96, {}, 2);
  source.add("dense_proj.weight", DType::kF32, {40, 200}, test::random_floats(40 * 200, 3, 0.05f));
  auto l = load(source, spec({"gate_proj", "up_proj", "dense_proj"}, {96, 96, 40}, 200));
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ((*l)->out_features(), 232);
  expect_matches_dense(**l, {}, 4, 11, "stack");
  // Each part equals the module alone.
  auto gate = load(source, spec({"gate_proj"}, {96}, 200));
  ASSERT_TRUE(gate.ok());
  const auto x = test::random_floats(2 * 200, 12);
  const auto stacked = run_linear(**l, x, 2), alone = run_linear(**gate, x, 2);
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 96; ++o) EXPECT_EQ(stacked[r * 232 + o], alone[r * 96 + o]);
}

TEST(Exl3Linear, AccumulateAdds) {
  MemorySource source;
  add_random_module(source, "m", 128, 128, {}, 21);
  auto l = load(source, spec({"m"}, {128}, 128));
  ASSERT_TRUE(l.ok());
  const auto x = test::random_floats(128, 4);
  const auto y = run_linear(**l, x, 1);
  std::vector<float> acc(128, 1.5f);
  LinearRun r;
  r.x = TensorView::contiguous(const_cast<float*>(x.data()), DType::kF32, {1, 128});
  r.y = TensorView::contiguous(acc.data(), DType::kF32, {1, 128});
  r.accumulate = true;
  ASSERT_TRUE((*l)->run(r, {}).ok());
  for (int o = 0; o < 128; ++o) EXPECT_EQ(acc[o], 1.5f + y[o]);
}

// Each loader error names the offending tensor.
void expect_error_names(const WeightSource& source, int64_t in, int64_t out, const std::string& tensor,
                        const std::string& also = "") {
  auto l = load(source, spec({"m"}, {out}, in));
  ASSERT_FALSE(l.ok()) << "expected an error naming " << tensor;
  const std::string msg = l.status().message();
  EXPECT_NE(msg.find("`" + tensor + "`"), std::string::npos) << msg;
  if (!also.empty()) EXPECT_NE(msg.find(also), std::string::npos) << msg;
}

TEST(Exl3Loader, ErrorsNameTheTensor) {
  {
    MemorySource s;
    add_random_module(s, "m", 128, 128, {}, 1);
    s.erase("m.svh");
    s.add("m.svh_other", DType::kF16, {128}, std::vector<uint16_t>(128));
    // Without svh/sv the module is not EXL3 by the spec's rule, but it has a trellis: a missing scale, not dense.
    expect_error_names(s, 128, 128, "m.svh", "missing");
  }
  {
    MemorySource s;
    add_random_module(s, "m", 128, 128, {}, 1);
    s.add("m.mcg", DType::kI32, {}, std::vector<uint32_t>{0x12345678u});
    expect_error_names(s, 128, 128, "m.mcg", "0x12345678");
  }
  {
    MemorySource s;
    add_random_module(s, "m", 128, 128, {}, 1);
    s.add("m.trellis", DType::kI16, {8, 8, 16 * 9}, std::vector<uint16_t>(8 * 8 * 16 * 9));
    expect_error_names(s, 128, 128, "m.trellis", "1..8");
  }
  {
    MemorySource s;
    add_random_module(s, "m", 128, 128, {}, 1);
    s.add("m.trellis", DType::kI16, {8, 8, 20}, std::vector<uint16_t>(8 * 8 * 20));
    expect_error_names(s, 128, 128, "m.trellis", "K");
  }
  {
    MemorySource s;
    add_random_module(s, "m", 256, 128, {}, 1);
    expect_error_names(s, 128, 128, "m.trellis", "padded to 128");  // the config says in = 128
  }
  {
    MemorySource s;
    add_random_module(s, "m", 128, 128, {}, 1);
    s.add("m.suh", DType::kF16, {64}, std::vector<uint16_t>(64));
    expect_error_names(s, 128, 128, "m.suh", "[128]");
  }
  {
    MemorySource s;
    add_random_module(s, "m", 128, 128, {}, 1);
    s.add("m.mul1", DType::kI32, {}, std::vector<uint32_t>{kMul1Multiplier});
    s.add("m.mcg", DType::kI32, {}, std::vector<uint32_t>{kMcgMultiplier});
    expect_error_names(s, 128, 128, "m", "both");
  }
  {
    MemorySource s;
    expect_error_names(s, 128, 128, "m.trellis", "neither");
  }
}

TEST(Exl3Experts, PairOutputsAreWeightedSwiGluOfEachExpert) {
  MemorySource source;
  const int64_t H = 128, I = 72, E = 3;
  ModuleOptions o;
  o.codebook = Codebook::kMcg;
  o.bits = 3;
  for (int e = 0; e < E; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    add_random_module(source, p + "gate_proj", H, I, o, 10 * e + 1);
    add_random_module(source, p + "down_proj", I, H, o, 10 * e + 3);
    if (e == 1)  // one expert's up_proj left dense
      source.add(p + "up_proj.weight", DType::kF32, {I, H}, test::random_floats(I * H, 5, 0.05f));
    else
      add_random_module(source, p + "up_proj", H, I, o, 10 * e + 2);
  }
  std::vector<ExpertLinears> experts;
  for (int e = 0; e < E; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    ExpertLinears x;
    x.gate = std::move(load(source, spec({p + "gate_proj"}, {I}, H))).value();
    x.up = std::move(load(source, spec({p + "up_proj"}, {I}, H))).value();
    x.down = std::move(load(source, spec({p + "down_proj"}, {H}, I))).value();
    experts.push_back(std::move(x));
  }
  std::vector<const Linear*> gate, up, down;
  for (auto& x : experts) gate.push_back(x.gate.get()), up.push_back(x.up.get()), down.push_back(x.down.get());
  auto set = make_cpu_expert_set("experts", std::move(experts), H, I);

  const int64_t n = 3;
  const int top_k = 2;
  const std::vector<int32_t> ids = {0, 2, 1, 0, 2, 1};
  const std::vector<float> weights = {0.7f, 0.3f, 0.5f, 0.5f, 1.0f, 0.25f};
  const float limit = 0.5f;
  const auto x = test::random_floats(n * H, 8, 4.0f);
  std::vector<float> pair_out(n * top_k * H);
  ExpertRun run;
  run.x = TensorView::contiguous(const_cast<float*>(x.data()), DType::kF32, {n, H});
  run.routing.top_k = top_k;
  run.routing.ids = ids.data();
  run.routing.weights = weights.data();
  run.pair_out = pair_out.data();
  run.swiglu_limit = limit;
  auto computed_shared = set->run(run, {});
  ASSERT_TRUE(computed_shared.ok()) << computed_shared.status().to_string();
  EXPECT_FALSE(*computed_shared);
  bool clamped = false;
  for (int64_t p = 0; p < n * top_k; ++p) {
    const std::vector<float> row(x.begin() + (p / top_k) * H, x.begin() + (p / top_k + 1) * H);
    const auto g = run_linear(*gate[ids[p]], row, 1), u = run_linear(*up[ids[p]], row, 1);
    std::vector<float> act(I);
    for (int i = 0; i < I; ++i) {
      const float gi = std::min(g[i], limit), ui = std::clamp(u[i], -limit, limit);
      clamped = clamped || g[i] > limit || std::abs(u[i]) > limit;
      act[i] = gi / (1.0f + std::exp(-gi)) * ui;
    }
    const auto d = run_linear(*down[ids[p]], act, 1);
    for (int64_t h = 0; h < H; ++h) EXPECT_FLOAT_EQ(pair_out[p * H + h], weights[p] * d[h]) << p << "," << h;
  }
  EXPECT_TRUE(clamped) << "the test should exercise swiglu_limit";
}

}  // namespace
}  // namespace kiln::exl3
