// The CPU model's bf16 precision (model.precision = "bf16"): weights rounded to bf16 at load where the CUDA runner
// rounds them, activations rounded at the GPU's bf16 storage points (mla_moe_model.h lists them). Checked here: the
// weights' values, rounding points visible from outside (the normed hidden states, the lm_head input), closeness
// to the fp32 reference, and the recipe key. tests/gpu/cuda_model_test.cpp checks it against the GPU itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "kernels/cpu/half_float.h"
#include "model/host_experts_bf16.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

using testing::load_reference;
using testing::relative_error;
using testing::model_dir;
using testing::cpu_model;
using testing::make_kv_cache;

LoadedModel load(const std::string& name, const std::string& precision) {
  auto recipe = load_recipe("", {"model.path=" + model_dir(name).string(), "kv.layout=bf16", "kv.block_size=4",
                                 "model.device=cpu", "model.precision=" + precision},
                            global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

std::vector<int32_t> prompt_of(const std::string& name) { return load_reference(name).ids("prompt_ids"); }

bool is_bf16_value(float x) { return cpu::round_to_bf16(x) == x; }

// A CPU linear's weight as fp32 [out, in].
std::vector<float> weight_of(const Linear& l) {
  std::vector<float> w(l.out_features() * l.in_features());
  EXPECT_TRUE(l.dequantize(TensorView::contiguous(w.data(), DType::kF32, {l.out_features(), l.in_features()}), {}).ok());
  return w;
}

// How many of `xs` are not bf16 values.
int64_t off_grid(const std::vector<float>& xs) {
  return std::count_if(xs.begin(), xs.end(), [](float x) { return !is_bf16_value(x); });
}

// Every element of `got` is the bf16 rounding of the same element of `fp32`.
void expect_rounded(const std::vector<float>& got, const std::vector<float>& fp32, const std::string& what) {
  ASSERT_EQ(got.size(), fp32.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], cpu::round_to_bf16(fp32[i])) << what << "[" << i << "]";
}

// glm4_moe_lite-tiny is stored in fp32 (off the bf16 grid), so rounding changes its values; glm_moe_dsa-tiny (bf16
// but for the router bias) brings the indexer.
class Bf16Weights : public ::testing::TestWithParam<std::string> {};

TEST_P(Bf16Weights, AreRoundedWhereTheGpuRoundsThemAndKeptFp32WhereItKeepsThem) {
  const bool fp32_checkpoint = GetParam() == "glm4_moe_lite-tiny";
  LoadedModel a = load(GetParam(), "fp32");
  LoadedModel b = load(GetParam(), "bf16");
  const ModelWeights& wa = cpu_model(a).weights();
  const ModelWeights& wb = cpu_model(b).weights();
  EXPECT_EQ(wa.precision, Precision::kFp32);
  EXPECT_EQ(wb.precision, Precision::kBf16);
  ASSERT_EQ(wb.embed_tokens.dtype, DType::kBF16);
  std::vector<float> embed_a(cpu_model(a).config().hidden_size), embed_b(embed_a.size());
  for (int32_t id = 0; id < cpu_model(a).config().vocab_size; id += 37) {
    ASSERT_TRUE(cpu_model(a).embed(&id, 1, embed_a.data()).ok());
    ASSERT_TRUE(cpu_model(b).embed(&id, 1, embed_b.data()).ok());
    for (int64_t i = 0; i < cpu_model(a).config().hidden_size; ++i)
      ASSERT_EQ(embed_b[i], cpu::round_to_bf16(embed_a[i])) << "embedding " << id << "[" << i << "]";
  }
  expect_rounded(wb.final_norm, wa.final_norm, "final_norm");
  const ModelConfig& c = cpu_model(a).config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& la = wa.layers[l];
    const LayerWeights& lb = wb.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    expect_rounded(lb.input_norm, la.input_norm, p + "input_norm");
    expect_rounded(lb.post_attention_norm, la.post_attention_norm, p + "post_attention_norm");
    expect_rounded(lb.attn.q_a_norm, la.attn.q_a_norm, p + "q_a_norm");
    expect_rounded(lb.attn.kv_a_norm, la.attn.kv_a_norm, p + "kv_a_norm");
    expect_rounded(lb.attn.kv_b_f32, la.attn.kv_b_f32, p + "kv_b");
    const std::vector<float> wa_o = weight_of(*la.attn.o_proj), wb_o = weight_of(*lb.attn.o_proj);
    expect_rounded(wb_o, wa_o, p + "o_proj");
    if (fp32_checkpoint) EXPECT_GT(off_grid(wa_o), 0) << p;
    if (la.attn.indexer) {
      // The indexer's key LayerNorm stays fp32.
      EXPECT_EQ(lb.attn.indexer->k_norm_weight, la.attn.indexer->k_norm_weight) << p;
      EXPECT_EQ(lb.attn.indexer->k_norm_bias, la.attn.indexer->k_norm_bias) << p;
    }
    if (!la.is_moe) continue;
    // The router runs in fp32 on the GPU: its weights and bias are not rounded.
    EXPECT_EQ(lb.moe.router, la.moe.router) << p;
    if (fp32_checkpoint) EXPECT_GT(off_grid(la.moe.router), 0) << p;
    EXPECT_EQ(lb.moe.router_bias, la.moe.router_bias) << p;
    // Routed experts as Linears in bf16 (the model rounds SwiGLU between them), an ExpertSet in fp32.
    EXPECT_NE(la.moe.experts, nullptr);
    EXPECT_TRUE(la.moe.expert_mlps.empty());
    EXPECT_EQ(lb.moe.experts, nullptr);
    ASSERT_EQ(static_cast<int64_t>(lb.moe.expert_mlps.size()), c.n_routed_experts) << p;
    const Linear& down = *lb.moe.expert_mlps.back().down;
    EXPECT_EQ(down.out_features(), c.hidden_size);
    EXPECT_EQ(down.in_features(), c.moe_intermediate_size);
    const std::vector<float> d = weight_of(down);
    EXPECT_EQ(off_grid(d), 0) << p << "last expert's down_proj";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16Weights, ::testing::Values("glm4_moe_lite-tiny", "glm_moe_dsa-tiny"));

// Rounding points seen from outside the model: the final-normed hidden state (keep_hidden) is a bf16 tensor, and the
// logits are exactly lm_head applied to it (the lm_head input is the rounded normed state, the logits fp32).
TEST(Bf16Precision, NormedHiddenStatesAreBf16AndTheLogitsAreTheirProjection) {
  for (const std::string name : {"glm4_moe_lite-tiny", "deepseek_v3-tiny", "glm_moe_dsa-tiny"}) {
    for (const std::string precision : {"fp32", "bf16"}) {
      LoadedModel m = load(name, precision);
      const std::vector<int32_t> prompt = prompt_of(name);
      const int64_t T = static_cast<int64_t>(prompt.size()), Hd = cpu_model(m).config().hidden_size;
      const int64_t vocab = cpu_model(m).config().vocab_size;
      auto kv = make_kv_cache(m, T);
      std::vector<int32_t> table;
      ASSERT_TRUE(kv->reserve(table, T).ok());
      // Two chunks: 17 rows (the expanded form in bf16 precision for the non-DSA models) and 7 (absorbed).
      std::vector<float> hidden, logits;
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 17}, {17, T}}) {
        SequenceStep step{std::span<const int32_t>(prompt.data() + begin, end - begin), begin, &table, true};
        StepOutput out;
        ASSERT_TRUE(cpu_model(m).forward({&step, 1}, kv->views(), {.want_hidden = true}, out).ok()) << name;
        hidden.insert(hidden.end(), out.hidden.begin(), out.hidden.end());
        logits.insert(logits.end(), out.logits.begin(), out.logits.end());
      }
      ASSERT_EQ(static_cast<int64_t>(hidden.size()), T * Hd);
      if (precision == "bf16") {
        EXPECT_EQ(off_grid(hidden), 0) << name;
        std::vector<float> projected(T * vocab);
        ASSERT_TRUE(run_linear(*cpu_model(m).weights().lm_head, hidden.data(), T, projected.data()).ok());
        EXPECT_EQ(projected, logits) << name;
      } else {
        EXPECT_GT(off_grid(hidden), T * Hd / 2) << name;  // the fp32 path rounds nothing there
      }
    }
  }
}

// Against the fp32 reference on the fixture prompts and 16 teacher-forced decode steps: every logits row within
// 5e-2 of max|fp32| (the GPU test's bf16 tolerance) but rows routed by a near-tie in fp32 (MoE margin < 1e-2) and
// DSA rows attending through a selection (a near-tied top-k pick flips with bf16 activations); those are counted.
class Bf16VsFp32 : public ::testing::TestWithParam<std::string> {};

TEST_P(Bf16VsFp32, LogitsStayWithinBf16ToleranceOfTheFp32Reference) {
  constexpr int64_t kNew = 16;
  constexpr double kTolerance = 5e-2;
  constexpr float kRouterNearTie = 1e-2f;
  LoadedModel a = load(GetParam(), "fp32");
  LoadedModel b = load(GetParam(), "bf16");
  const ModelConfig& c = cpu_model(a).config();
  const int64_t vocab = c.vocab_size;
  std::vector<int32_t> tokens = prompt_of(GetParam());
  const int64_t P = static_cast<int64_t>(tokens.size());
  auto kv_a = make_kv_cache(a, P + kNew), kv_b = make_kv_cache(b, P + kNew);
  std::vector<int32_t> ta, tb;
  ASSERT_TRUE(kv_a->reserve(ta, P + kNew).ok());
  ASSERT_TRUE(kv_b->reserve(tb, P + kNew).ok());
  std::vector<float> rows_a, rows_b, margins;
  SequenceStep step{tokens, 0, &ta, true};
  for (int64_t s = 0; s <= kNew; ++s) {
    StepOutput oa, ob;
    ASSERT_TRUE(cpu_model(a).forward({&step, 1}, kv_a->views(), {.record_router_margin = true}, oa).ok());
    step.block_table = &tb;
    ASSERT_TRUE(cpu_model(b).forward({&step, 1}, kv_b->views(), {}, ob).ok());
    rows_a.insert(rows_a.end(), oa.logits.begin(), oa.logits.end());
    rows_b.insert(rows_b.end(), ob.logits.begin(), ob.logits.end());
    margins.insert(margins.end(), oa.router_margin.begin(), oa.router_margin.end());
    const int32_t next = static_cast<int32_t>(std::max_element(oa.logits.end() - vocab, oa.logits.end()) -
                                              (oa.logits.end() - vocab));
    tokens.push_back(next);
    step = SequenceStep{std::span<const int32_t>(&tokens.back(), 1), P + s, &ta, false};
  }
  const int64_t rows = static_cast<int64_t>(rows_a.size()) / vocab;
  ASSERT_EQ(rows, P + kNew);
  double worst = 0;
  int64_t excluded = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double e = relative_error(rows_b.data() + r * vocab, rows_a.data() + r * vocab, vocab);
    if ((c.has_indexer() && r + 1 > c.index_topk) || margins[r] < kRouterNearTie) {
      ++excluded;
      EXPECT_TRUE(std::isfinite(e)) << "row " << r;
      continue;
    }
    worst = std::max(worst, e);
    EXPECT_LE(e, kTolerance) << "row " << r;
  }
  EXPECT_GT(worst, 0.0) << "bf16 precision computed exactly the fp32 logits";
  std::printf("%s: bf16 vs fp32 worst logits error %.3g of max|fp32| over %lld rows (%lld near-tie / DSA-selected rows "
              "left out)\n",
              GetParam().c_str(), worst, static_cast<long long>(rows - excluded), static_cast<long long>(excluded));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16VsFp32,
                         ::testing::Values("glm4_moe_lite-tiny", "deepseek_v3-tiny", "glm_moe_dsa-tiny"));

// Where the bf16 precision models the GPU folding a shared expert into the routed experts' launches (gate / up kept
// fp32): a dense shared expert of the routed shape, in steps of up to 32 rows. glm4_moe_lite-tiny's one shared expert
// folds; h3-qproj's two (twice the routed width) run apart; so do any format's non-dense modules (EXL3), whose
// expert set folds nothing. And the choice shows: a 32-row step's shared expert differs from the apart form's.
TEST(Bf16Precision, TheSharedExpertFoldsWhereTheGpuFoldsIt) {
  LoadedModel tiny = load("glm4_moe_lite-tiny", "bf16");
  LoadedModel two = load("glm4_moe_lite-h3-qproj", "bf16");
  auto moe_layer = [](LoadedModel& m) -> const LayerWeights& {
    for (const LayerWeights& l : cpu_model(m).weights().layers)
      if (l.is_moe) return l;
    ADD_FAILURE() << "no MoE layer";
    return cpu_model(m).weights().layers[0];
  };
  const LayerWeights& t = moe_layer(tiny);
  const int64_t inter = tiny.info.moe_intermediate_size;
  ASSERT_FALSE(t.moe.expert_mlps.empty());
  EXPECT_TRUE(gpu_folds_shared_expert(1, t.moe.shared, &t.moe.expert_mlps[0], inter));
  EXPECT_TRUE(gpu_folds_shared_expert(kGpuFoldedSharedExpertRows, t.moe.shared, &t.moe.expert_mlps[0], inter));
  EXPECT_FALSE(gpu_folds_shared_expert(kGpuFoldedSharedExpertRows + 1, t.moe.shared, &t.moe.expert_mlps[0], inter));
  EXPECT_FALSE(gpu_folds_shared_expert(1, t.moe.shared, nullptr, inter));
  const LayerWeights& w = moe_layer(two);
  ASSERT_FALSE(w.moe.expert_mlps.empty());
  EXPECT_FALSE(gpu_folds_shared_expert(1, w.moe.shared, &w.moe.expert_mlps[0], two.info.moe_intermediate_size));

  // The folded form keeps gate / up in fp32: on the same 32 rows its output differs from the apart form's (gate / up
  // rounded to bf16 first), by bf16 steps, not more.
  const int64_t hidden = tiny.info.hidden_size, rows = kGpuFoldedSharedExpertRows;
  std::vector<float> x(rows * hidden), folded(rows * hidden), apart(rows * hidden);
  for (int64_t i = 0; i < rows * hidden; ++i) x[i] = cpu::round_to_bf16(std::sin(0.37f * static_cast<float>(i)));
  ASSERT_TRUE(expert_mlp_bf16(t.moe.shared, x.data(), rows, folded.data()).ok());
  std::vector<float> g(rows * inter), u(rows * inter), a(rows * inter);
  ASSERT_TRUE(run_linear(*t.moe.shared.gate, x.data(), rows, g.data()).ok());
  ASSERT_TRUE(run_linear(*t.moe.shared.up, x.data(), rows, u.data()).ok());
  cpu::round_to_bf16(g.data(), rows * inter);
  cpu::round_to_bf16(u.data(), rows * inter);
  for (int64_t i = 0; i < rows * inter; ++i) a[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  cpu::round_to_bf16(a.data(), rows * inter);
  ASSERT_TRUE(run_linear(*t.moe.shared.down, a.data(), rows, apart.data()).ok());
  EXPECT_NE(folded, apart);
  EXPECT_LT(relative_error(folded.data(), apart.data(), rows * hidden), 2e-2);
}

TEST(Bf16Precision, RecipeKeyDefaultsToFp32AndRejectsOtherValuesByName) {
  auto plain = load_recipe("", {"model.path=" + model_dir("deepseek_v3-tiny").string()}, global_registry());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->section("model").get_string("precision"), "fp32");
  auto bad = load_recipe("", {"model.path=" + model_dir("deepseek_v3-tiny").string(), "model.precision=fp16"},
                         global_registry());
  ASSERT_FALSE(bad.ok());
  const std::string msg = bad.status().message();
  EXPECT_NE(msg.find("precision"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp32, bf16"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kiln
