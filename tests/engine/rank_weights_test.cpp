// A tensor-parallel rank's weights in the memory model (engine/rank_weights.h): every stored tensor is split, owned
// by one rank or replicated exactly as the CUDA runner loads it, so the ranks' parts add up to one rank's weights
// plus (N − 1) copies of the replicated ones — for even and uneven splits (3 ranks over 4 heads and 8 experts) —
// and the screen prices the largest rank. One rank is priced as before.
#include "engine/rank_weights.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "engine/memory_model.h"
#include "model/checkpoint.h"
#include "model/model_config.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {

const std::string kModels = std::string(KILN_SOURCE_DIR) + "/tests/data/models/";

ModelConfig config_of(const std::string& model) {
  auto c = ModelConfig::load(kModels + model + "/config.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return std::move(c).value();
}

TEST(RankWeights, HoldingsFollowTheRunnersSplit) {
  const ModelConfig c = config_of("glm4_moe_lite-tiny");
  EXPECT_EQ(rank_holding(c, "model.layers.1.self_attn.q_b_proj.weight"), RankHolding::kRows);
  EXPECT_EQ(rank_holding(c, "model.layers.1.self_attn.kv_b_proj.weight"), RankHolding::kRows);
  EXPECT_EQ(rank_holding(c, "model.layers.0.mlp.gate_proj.weight"), RankHolding::kRows);
  EXPECT_EQ(rank_holding(c, "model.embed_tokens.weight"), RankHolding::kRows);
  EXPECT_EQ(rank_holding(c, "lm_head.weight"), RankHolding::kRows);
  EXPECT_EQ(rank_holding(c, "model.layers.1.mlp.experts.5.down_proj.weight"), RankHolding::kRoutedExpert);
  EXPECT_EQ(rank_holding(c, "model.layers.1.mlp.shared_experts.gate_proj.weight"), RankHolding::kSharedExpert);
  for (const char* whole : {"model.layers.1.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
                            "model.layers.1.mlp.gate.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                            "model.layers.1.input_layernorm.weight", "model.norm.weight"})
    EXPECT_EQ(rank_holding(c, whole), RankHolding::kReplicated) << whole;
  // The shared expert on the last rank only; expert 5 of 8 on rank 1 of 2 and rank 1 of 3 (units [2, 5) there).
  const std::string shared = "model.layers.1.mlp.shared_experts.up_proj.weight";
  EXPECT_EQ(rank_tensor_bytes(c, shared, 1000, {0, 2}), 0u);
  EXPECT_EQ(rank_tensor_bytes(c, shared, 1000, {1, 2}), 1000u);
  EXPECT_EQ(rank_tensor_bytes(c, shared, 1000, {2, 3}), 1000u);
  const std::string e5 = "model.layers.1.mlp.experts.5.up_proj.weight";
  EXPECT_EQ(rank_tensor_bytes(c, e5, 1000, {1, 2}), 1000u);
  EXPECT_EQ(rank_tensor_bytes(c, e5, 1000, {0, 2}), 0u);
  EXPECT_EQ(rank_tensor_bytes(c, e5, 1000, {1, 3}), 0u);
  EXPECT_EQ(rank_tensor_bytes(c, e5, 1000, {2, 3}), 1000u);
  // 4 heads over 3 ranks: 1, 1, 2 of them.
  const std::string q_b = "model.layers.1.self_attn.q_b_proj.weight";
  EXPECT_EQ(rank_tensor_bytes(c, q_b, 400, {0, 3}), 100u);
  EXPECT_EQ(rank_tensor_bytes(c, q_b, 400, {1, 3}), 100u);
  EXPECT_EQ(rank_tensor_bytes(c, q_b, 400, {2, 3}), 200u);
  // One rank holds everything.
  EXPECT_EQ(rank_tensor_bytes(c, e5, 1000, {0, 1}), 1000u);
  EXPECT_EQ(rank_tensor_bytes(c, shared, 1000, {0, 1}), 1000u);
}

TEST(RankWeights, EveryTensorsPartsAddUpOverTheRanks) {
  for (const std::string model : {"glm4_moe_lite-tiny", "glm_moe_dsa-h3d16-shared", "deepseek_v3-tiny"}) {
    const ModelConfig c = config_of(model);
    auto ckpt = Checkpoint::open(kModels + model);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    for (int world : {2, 3, 4}) {
      for (const std::string& name : (*ckpt)->names()) {
        auto t = (*ckpt)->get(name);
        ASSERT_TRUE(t.ok());
        const uint64_t bytes = static_cast<uint64_t>(t->numel()) * 2;
        uint64_t sum = 0, holders = 0;
        for (int r = 0; r < world; ++r) {
          const uint64_t part = rank_tensor_bytes(c, name, bytes, {r, world});
          sum += part;
          holders += part > 0;
        }
        const bool replicated = rank_holding(c, name) == RankHolding::kReplicated;
        EXPECT_EQ(sum, replicated ? bytes * world : bytes) << model << " " << name << " over " << world;
        if (rank_holding(c, name) == RankHolding::kRoutedExpert || rank_holding(c, name) == RankHolding::kSharedExpert)
          EXPECT_EQ(holders, 1u) << name;
      }
    }
  }
}

TEST(RankWeights, UnitBytesTelescope) {
  for (int world : {1, 2, 3, 5, 7})
    for (int64_t units : {1, 3, 4, 7, 4096, 151552}) {
      if (units < world) continue;
      const uint64_t bytes = static_cast<uint64_t>(units) * 12345 + 7;  // not a multiple of units
      uint64_t sum = 0;
      for (int r = 0; r < world; ++r) sum += rank_unit_bytes(bytes, units, {r, world});
      EXPECT_EQ(sum, bytes) << units << " units over " << world;
    }
}

// The screen of a CUDA recipe (priced without a GPU: the device memory given).
MemoryInputs screen_inputs(const std::string& model, std::vector<std::string> sets) {
  sets.push_back("model.path=" + kModels + model);
  sets.push_back("model.device=cuda");
  auto recipe = load_recipe(std::string(KILN_SOURCE_DIR) + "/configs/tiny-cpu.toml", sets, global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  ScreenOptions o;
  o.memory_bytes = 80ull << 30;
  auto in = memory_inputs(*recipe, global_registry(), o);
  EXPECT_TRUE(in.ok()) << in.status().to_string();
  return std::move(in).value();
}

const MemoryTerm& weights_term(const MemoryInputs& in) {
  for (const MemoryTerm& t : in.terms)
    if (t.name == "weights") return t;
  ADD_FAILURE() << "no weights term";
  return in.terms.front();
}

class RankWeightsScreen : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// Σ over the ranks = F + (N − 1)·R for the same R at every N (R: the replicated bytes), the term is the largest
// rank's, the routed experts are split among the ranks, and parallel.tensor = 1 prices what it always did.
TEST_P(RankWeightsScreen, RanksSumToOneRankPlusReplicas) {
  // Plain copies, not a structured binding: the lambda below captures `model`, which clang (the sanitizer build)
  // refuses for a binding.
  const auto model = std::get<0>(GetParam());
  const bool dummy = std::get<1>(GetParam());
  std::vector<std::string> base;
  if (dummy) base.push_back("model.load=dummy");
  const MemoryInputs one = screen_inputs(model, base);
  auto with = [&](int tp) {
    std::vector<std::string> s = base;
    s.push_back("parallel.tensor=" + std::to_string(tp));
    return screen_inputs(model, s);
  };
  const MemoryInputs tp1 = with(1);
  EXPECT_TRUE(one.rank_weights.empty());
  EXPECT_TRUE(tp1.rank_weights.empty());
  EXPECT_EQ(weights_term(tp1).low, weights_term(one).low);
  EXPECT_EQ(weights_term(tp1).high, weights_term(one).high);
  const double full = static_cast<double>(weights_term(one).low);

  std::vector<double> replicated;
  for (int tp : {2, 3, 4}) {
    const MemoryInputs in = with(tp);
    ASSERT_EQ(in.rank_weights.size(), static_cast<size_t>(tp));
    double sum = 0;
    uint64_t experts = 0, largest = 0;
    for (const auto& r : in.rank_weights) {
      sum += static_cast<double>(r.low);
      experts += r.routed_experts;
      largest = std::max(largest, r.high);
      EXPECT_LT(r.low, weights_term(one).low);
    }
    EXPECT_EQ(weights_term(in).high, largest);
    EXPECT_NEAR(static_cast<double>(experts), static_cast<double>(in.full_routed_experts),
                dummy ? 1e-9 * full + 8 : 0.0);
    EXPECT_GT(in.full_routed_experts, 0u);
    replicated.push_back((sum - full) / (tp - 1));
    // The last rank holds the shared expert: with an even split it is the largest.
    if (tp == 2) {
      EXPECT_GT(in.rank_weights[1].low, in.rank_weights[0].low);
      EXPECT_NEAR(static_cast<double>(in.rank_weights[0].routed_experts), in.full_routed_experts / 2.0, 1.0);
    }
  }
  EXPECT_GT(replicated[0], 0);
  EXPECT_LT(replicated[0], full);
  for (double r : replicated) EXPECT_NEAR(r, replicated[0], dummy ? 1e-9 * full + 8 : 0.0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RankWeightsScreen,
                         ::testing::Combine(::testing::Values("glm4_moe_lite-tiny", "glm_moe_dsa-h3d16-shared"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + (std::get<1>(info.param) ? "_dummy" : "_checkpoint");
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace kiln
