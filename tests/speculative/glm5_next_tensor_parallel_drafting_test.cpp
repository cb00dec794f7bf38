// glm5_next through the engine on CPU ranks (parallel.tensor = 2, threads of this process): greedy output equals one
// rank's, alone and with MTP drafting — the next-n layer (DSA with its indexer, KDA with its state, or a plain one)
// split like the trunk's layers, its drafts verified by the split target and its KDA state rolled back per rank.
#include <gtest/gtest.h>

#include <random>

#include "model/tensor_parallel_instance.h"
#include "speculative/speculative_test_support.h"

namespace kiln {
namespace {

std::vector<std::string> sets(const std::string& model, int tp, const std::string& method, int depth) {
  return {"model.path=" + testing::model_dir(model).string(),
          "model.device=cpu",
          "model.threads=2",
          "kv.layout=fp32",
          "kv.block_size=16",
          "scheduler.max_model_len=512",
          "scheduler.max_num_seqs=2",
          "parallel.tensor=" + std::to_string(tp),
          "speculative.method=" + method,
          "speculative.depth=" + std::to_string(method == "none" ? 0 : depth)};
}

class Glm5NextTensorParallelDrafting : public ::testing::TestWithParam<std::string> {};

TEST_P(Glm5NextTensorParallelDrafting, CpuRanksGenerateWhatOneRankDoesWithAndWithoutMtp) {
  testing::load_mtp_plugin();
  std::mt19937 rng(5);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(static_cast<int32_t>(rng() % 500) + 1);
  auto one_recipe = load_recipe("", sets(GetParam(), 1, "none", 0), global_registry());
  ASSERT_TRUE(one_recipe.ok()) << one_recipe.status().to_string();
  LoadedModel one = testing::load_with_mtp(*one_recipe, false);
  auto plain = testing::engine_generate(one, sets(GetParam(), 1, "none", 0), prompt, 24);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();

  auto recipe = load_recipe("", sets(GetParam(), 2, "mtp", 3), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  LoadedModel m = testing::load_with_mtp(*recipe);
  ASSERT_NE(dynamic_cast<TensorParallelInstance*>(m.model.get()), nullptr);
  ASSERT_GE(m.model->num_mtp_layers(), 1);
  auto split = testing::engine_generate(m, sets(GetParam(), 2, "none", 0), prompt, 24);
  ASSERT_TRUE(split.ok()) << split.status().to_string();
  EXPECT_EQ(*split, *plain);
  for (int depth : {1, 3}) {
    SCOPED_TRACE("MTP depth " + std::to_string(depth));
    EngineMetrics metrics;
    auto drafted = testing::engine_generate(m, sets(GetParam(), 2, "mtp", depth), prompt, 24, {}, {}, &metrics);
    ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
    EXPECT_EQ(*drafted, *plain);
    EXPECT_GT(metrics.spec_draft_tokens, 0) << "the drafter proposed nothing";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Glm5NextTensorParallelDrafting,
                         ::testing::Values("glm5_next-mtp-dsa", "glm5_next-mtp-kda", "glm5_next-mtp-plain"),
                         [](const auto& info) { return info.param.substr(std::string("glm5_next-mtp-").size()); });

}  // namespace
}  // namespace kiln
