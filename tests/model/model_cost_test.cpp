#include "model/model_cost.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace kiln {
namespace {

ModelConfig glm47_flash() {
  Result<ModelConfig> c = ModelConfig::load(std::string(KILN_SOURCE_DIR) + "/configs/models/glm-4.7-flash/config.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : ModelConfig{};
}

// Mean distinct experts over `trials` draws of `tokens` tokens, each picking `top_k` distinct experts of `experts`.
double simulated_distinct(int64_t experts, int64_t top_k, int64_t tokens, int trials) {
  std::mt19937 rng(7);
  std::vector<int> ids(experts);
  double sum = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<bool> hit(experts, false);
    for (int64_t b = 0; b < tokens; ++b) {
      std::iota(ids.begin(), ids.end(), 0);
      for (int64_t j = 0; j < top_k; ++j) {  // partial Fisher-Yates: the first top_k are a uniform k-subset
        std::uniform_int_distribution<int64_t> pick(j, experts - 1);
        std::swap(ids[j], ids[pick(rng)]);
        hit[ids[j]] = true;
      }
    }
    sum += static_cast<double>(std::count(hit.begin(), hit.end(), true));
  }
  return sum / trials;
}

TEST(ModelCost, DistinctExpertsIsTopKForOneTokenAndApproachesAllExperts) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(64, 4, 1), 4.0);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(64, 4, 0), 0.0);
  EXPECT_NEAR(expected_distinct_experts(64, 4, 1000), 64.0, 1e-9);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 8, 3), 8.0);  // every token takes every expert
}

TEST(ModelCost, DistinctExpertsMatchesUniformRoutingSimulation) {
  // Within 1 % of a 20,000-draw simulation (its standard error is well under 0.1 % at these sizes).
  for (auto [E, k, B] : {std::tuple{64, 4, 4}, std::tuple{64, 4, 16}, std::tuple{64, 4, 64}, std::tuple{8, 2, 3},
                         std::tuple{7, 3, 5}}) {
    const double formula = expected_distinct_experts(E, k, B);
    EXPECT_NEAR(formula, simulated_distinct(E, k, B, 20000), 0.01 * formula) << E << " experts, top-" << k << ", " << B;
  }
}

TEST(ModelCost, Glm47FlashActiveParamsAndDecodeBytesByHand) {
  const ModelConfig c = glm47_flash();
  // Per layer: attention q_a 2048·768 + q_b 768·20·256 + kv_a 2048·576 + kv_b 512·20·448 + o 20·256·2048
  // = 21,757,952; layer 0 dense 3·2048·10240 = 62,914,560; 46 MoE layers × (5 experts × 3·2048·1536 + router
  // 2048·64) = 46 × 47,316,992.
  const double params = 47.0 * 21757952 + 62914560 + 46.0 * 47316992;
  EXPECT_DOUBLE_EQ(active_params_per_token(c), params);
  // bf16 weights, the router fp32 (2 more bytes per parameter), one embedding row, lm_head 154880 × 2048:
  // 7.17 GB, the figure bench/RESULTS.md's rooflines used.
  const double one = 2 * params + 46.0 * 2048 * 64 * 2 + 2048 * 2 + 154880.0 * 2048 * 2;
  EXPECT_DOUBLE_EQ(decode_weight_bytes(c, 1), one);
  EXPECT_NEAR(one, 7.17e9, 0.01e9);
  // Batch 16: the same plus (distinct experts − 4) more experts per MoE layer and 15 more embedding rows.
  const double extra = (expected_distinct_experts(64, 4, 16) - 4) * 46 * 3.0 * 2048 * 1536 * 2 + 15 * 2048 * 2;
  EXPECT_NEAR(decode_weight_bytes(c, 16), one + extra, 1.0);
  // EXL3 K4 routed experts, the rest bf16 (weights.experts_only): the routed experts at half a byte a weight.
  const double routed = 46.0 * 4 * 3 * 2048 * 1536;
  EXPECT_DOUBLE_EQ(decode_weight_bytes(c, 1, WeightPricing{0.5, 2}), one - routed * 1.5);
  EXPECT_NEAR(decode_weight_bytes(c, 1, WeightPricing{0.5, 2}), 4.57e9, 0.01e9);  // RESULTS.md's figure
  // Every linear K4: kv_b is still read as its bf16 copy, the embedding row in bf16, the router in fp32.
  const double kv_b = 47.0 * 512 * 20 * 448, router = 46.0 * 2048 * 64;
  const double all_k4 = (params - kv_b - router) / 2 + 2 * kv_b + 4 * router + 2048 * 2 + 154880.0 * 2048 / 2;
  EXPECT_NEAR(decode_weight_bytes(c, 1, WeightPricing{0.5, 0.5}), all_k4, 1.0);
  EXPECT_DOUBLE_EQ(decode_kv_bytes(c, 3, 4096), 3.0 * 4096 * 47 * 576 * 2);
  // A layout's own bytes per token (fp8_ds_mla: 656 B a token and layer) replace bf16's 1,152.
  EXPECT_DOUBLE_EQ(decode_kv_bytes(c, 3, 4096, 47.0 * 656), 3.0 * 4096 * 47 * 656);
}

// What `kiln bench decode` prices a recipe's weights at: bf16; EXL3 dummies at weights.bits (the routed experts only
// with weights.experts_only); an EXL3 checkpoint as bf16, saying why.
TEST(ModelCost, RecipeWeightPricing) {
  auto recipe = [](const std::string& format, const std::string& load, int64_t bits, bool experts_only) {
    Recipe r;
    r.sections.emplace("weights", RecipeSection("weights"));
    r.sections.emplace("model", RecipeSection("model"));
    r.sections.at("weights").set("format", format);
    r.sections.at("weights").set("bits", bits);
    r.sections.at("weights").set("experts_only", experts_only);
    r.sections.at("model").set("load", load);
    return r;
  };
  std::string basis;
  WeightPricing p = recipe_weight_pricing(recipe("dense", "dummy", 4, false), basis);
  EXPECT_EQ(p.expert_bytes_per_weight, 2);
  EXPECT_EQ(p.other_bytes_per_weight, 2);
  EXPECT_EQ(basis, "bf16");
  p = recipe_weight_pricing(recipe("exl3", "dummy", 3, true), basis);
  EXPECT_EQ(p.expert_bytes_per_weight, 0.375);
  EXPECT_EQ(p.other_bytes_per_weight, 2);
  EXPECT_EQ(basis, "EXL3 3 bits per weight for the routed experts, bf16 for every other linear");
  p = recipe_weight_pricing(recipe("exl3", "dummy", 4, false), basis);
  EXPECT_EQ(p.expert_bytes_per_weight, 0.5);
  EXPECT_EQ(p.other_bytes_per_weight, 0.5);
  p = recipe_weight_pricing(recipe("exl3", "mmap", 4, false), basis);
  EXPECT_EQ(p.expert_bytes_per_weight, 2);
  EXPECT_NE(basis.find("not known before loading"), std::string::npos) << basis;
}

TEST(ModelCost, PrefillFlopsCountChunksAndCausalAttention) {
  const ModelConfig c = glm47_flash();
  const double linear = 2 * active_params_per_token(c), head = 2.0 * 2048 * 154880;
  const double attention_per_key = 2.0 * 47 * 20 * (256 + 256);
  EXPECT_DOUBLE_EQ(prefill_flops(c, 1, 8192), linear + head + attention_per_key);
  // 1000 tokens in chunks of 300: 4 chunks (4 logits rows), 1000·1001/2 keys seen.
  EXPECT_DOUBLE_EQ(prefill_flops(c, 1000, 300), 1000 * linear + 4 * head + attention_per_key * 500500);
  EXPECT_DOUBLE_EQ(prefill_flops(c, 0, 300), 0.0);
}

}  // namespace
}  // namespace kiln
