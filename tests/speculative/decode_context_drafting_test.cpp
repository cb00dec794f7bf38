// Decode-context parallelism through the engine: CPU ranks that split the KV cache by token (parallel.decode_context)
// generate what one rank does — the MLA/MoE family and glm5_next — alone and with MTP drafting at several depths (the MTP layer's KV is split like the
// trunk's, its drafts verified by the split target). Greedy; the split's attention rounds differently from one rank
// (LSE merge), and the prompt's tokens have no near-ties for that to flip.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "speculative/speculative_test_support.h"

namespace kiln {
namespace {

std::vector<std::string> dcp_sets(const std::string& model, int tp, int dcp, const std::string& method, int depth) {
  return {"model.path=" + testing::model_dir(model).string(),
          "model.device=cpu",
          "model.threads=2",
          "kv.layout=fp32",
          "kv.block_size=4",
          "scheduler.max_model_len=256",
          "parallel.tensor=" + std::to_string(tp),
          "parallel.decode_context=" + std::to_string(dcp),
          "speculative.method=" + method,
          "speculative.depth=" + std::to_string(method == "none" ? 0 : depth)};
}

struct Case {
  std::string model;
  std::vector<std::pair<int, int>> splits;  // (parallel.tensor, decode_context)
};

// The MLA/MoE family, and glm5_next with a next-n layer of each kind: a DSA one (its latents and indexer rows split
// like the trunk's) and a KDA one (its state whole per sequence, snapshotted and restored around verification).
class DecodeContextDrafting : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeContextDrafting, EngineOutputOfSplitKvRanksEqualsOneRankWithAndWithoutMtp) {
  testing::load_mtp_plugin();
  const std::string& model = GetParam().model;
  const std::vector<int32_t> prompt = {5, 17, 301, 42, 7, 99, 250, 3, 64, 128, 11, 400};
  auto one_recipe = load_recipe("", dcp_sets(model, 1, 1, "mtp", 3), global_registry());
  ASSERT_TRUE(one_recipe.ok()) << one_recipe.status().to_string();
  LoadedModel one = testing::load_with_mtp(*one_recipe);
  auto plain = testing::engine_generate(one, dcp_sets(model, 1, 1, "none", 0), prompt, 24);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();

  for (const auto& [tp, dcp] : GetParam().splits) {
    SCOPED_TRACE("parallel.tensor = " + std::to_string(tp) + ", decode_context = " + std::to_string(dcp));
    auto recipe = load_recipe("", dcp_sets(model, tp, dcp, "mtp", 3), global_registry());
    ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
    LoadedModel m = testing::load_with_mtp(*recipe);
    ASSERT_EQ(m.model->num_mtp_layers(), 1);
    auto split = testing::engine_generate(m, dcp_sets(model, tp, dcp, "none", 0), prompt, 24);
    ASSERT_TRUE(split.ok()) << split.status().to_string();
    EXPECT_EQ(*split, *plain);
    for (int depth : {1, 3}) {
      SCOPED_TRACE("MTP depth " + std::to_string(depth));
      EngineMetrics metrics;
      auto drafted =
          testing::engine_generate(m, dcp_sets(model, tp, dcp, "mtp", depth), prompt, 24, {}, {}, &metrics);
      ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
      EXPECT_EQ(*drafted, *split) << "drafting must not change the split model's output";
      EXPECT_GT(metrics.spec_draft_tokens, 0) << "the drafter proposed nothing";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DecodeContextDrafting,
                         ::testing::Values(Case{"glm4_moe_lite-tiny", {{2, 2}, {4, 2}}},
                                           Case{"glm5_next-mtp-dsa", {{2, 2}}},
                                           Case{"glm5_next-mtp-kda", {{2, 2}}}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

}  // namespace
}  // namespace kiln
