// Tensor parallelism through the engine: CPU ranks (parallel.tensor = 2 and 3) generate exactly what one rank does,
// alone and with MTP drafting at several depths (the MTP layer is split like the others and its drafts are verified
// by the split target), greedy and sampled with a seed.
#include <gtest/gtest.h>

#include "speculative/speculative_test_support.h"

namespace kiln {
namespace {

std::vector<std::string> tp_sets(int tp, const std::string& method, int depth) {
  return {"model.path=" + testing::model_dir("glm4_moe_lite-tiny").string(),
          "model.device=cpu",
          "model.threads=2",
          "kv.layout=fp32",
          "kv.block_size=4",
          "scheduler.max_model_len=256",
          "parallel.tensor=" + std::to_string(tp),
          "speculative.method=" + method,
          "speculative.depth=" + std::to_string(method == "none" ? 0 : depth)};
}

TEST(TensorParallelDrafting, EngineOutputOfCpuRanksEqualsOneRankWithAndWithoutMtp) {
  testing::load_mtp_plugin();
  const std::vector<int32_t> prompt = {5, 17, 301, 42, 7, 99, 250, 3, 64, 128, 11, 400};
  auto one_recipe = load_recipe("", tp_sets(1, "mtp", 3), global_registry());
  ASSERT_TRUE(one_recipe.ok()) << one_recipe.status().to_string();
  LoadedModel one = testing::load_with_mtp(*one_recipe);
  auto plain = testing::engine_generate(one, tp_sets(1, "none", 0), prompt, 24);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  SamplingOptions sampled;
  sampled.temperature = 0.8f;
  sampled.seed = 1234;
  auto plain_sampled = testing::engine_generate(one, tp_sets(1, "none", 0), prompt, 24, sampled);
  ASSERT_TRUE(plain_sampled.ok()) << plain_sampled.status().to_string();

  for (int tp : {2, 3}) {
    SCOPED_TRACE("parallel.tensor = " + std::to_string(tp));
    auto recipe = load_recipe("", tp_sets(tp, "mtp", 3), global_registry());
    ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
    LoadedModel m = testing::load_with_mtp(*recipe);
    ASSERT_EQ(m.model->num_mtp_layers(), 1);
    auto split = testing::engine_generate(m, tp_sets(tp, "none", 0), prompt, 24);
    ASSERT_TRUE(split.ok()) << split.status().to_string();
    EXPECT_EQ(*split, *plain);
    auto split_sampled = testing::engine_generate(m, tp_sets(tp, "none", 0), prompt, 24, sampled);
    ASSERT_TRUE(split_sampled.ok()) << split_sampled.status().to_string();
    EXPECT_EQ(*split_sampled, *plain_sampled);
    for (int depth : {1, 3}) {
      SCOPED_TRACE("MTP depth " + std::to_string(depth));
      EngineMetrics metrics;
      auto drafted = testing::engine_generate(m, tp_sets(tp, "mtp", depth), prompt, 24, {}, {}, &metrics);
      ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
      EXPECT_EQ(*drafted, *plain);
      EXPECT_GT(metrics.spec_draft_tokens, 0) << "the drafter proposed nothing";
    }
  }
}

}  // namespace
}  // namespace kiln
