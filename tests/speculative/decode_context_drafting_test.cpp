// Decode-context parallelism through the engine: CPU ranks that split the KV cache by token (parallel.decode_context)
// generate what one rank does — the MLA/MoE family and glm5_next — alone and with MTP drafting at several depths (the MTP layer's KV is split like the
// trunk's, its drafts verified by the split target). Greedy; the split's attention rounds differently from one rank
// (LSE merge), and the prompt's tokens have no near-ties for that to flip.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "engine/single_request.h"
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

// One engine on split ranks serving a prompt in chunks of 8 tokens (max_num_batched_tokens; the scheduler's blocks
// are kv.block_size × decode_context = 8 tokens), then the same prompt again over its cached prefix: both give one
// rank's unchunked tokens, and the second is served from the prefix cache (a block is one page on each rank, so a
// cached block holds every rank's share). glm5_next keeps no prefix cache (its KDA state is not in the blocks): it
// is chunked only.
TEST(DecodeContextEngine, ChunkedPrefillAndThePrefixCacheGiveOneRanksTokens) {
  testing::load_mtp_plugin();
  const std::vector<int32_t> prompt = {5, 17, 301, 42, 7, 99, 250, 3, 64, 128, 11, 400, 19, 23, 88, 2, 77, 301, 9, 45};
  for (const std::string model : {"glm4_moe_lite-tiny", "glm_moe_dsa-tiny", "glm5_next-tiny"}) {
    SCOPED_TRACE(model);
    auto one_recipe = load_recipe("", dcp_sets(model, 1, 1, "none", 0), global_registry());
    ASSERT_TRUE(one_recipe.ok()) << one_recipe.status().to_string();
    LoadedModel one = testing::load_with_mtp(*one_recipe);
    auto want = testing::engine_generate(one, dcp_sets(model, 1, 1, "none", 0), prompt, 16);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    std::vector<std::string> sets = dcp_sets(model, 2, 2, "none", 0);
    sets.push_back("scheduler.max_num_batched_tokens=8");
    sets.push_back("scheduler.max_num_seqs=4");
    auto recipe = load_recipe("", sets, global_registry());
    ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
    LoadedModel m = testing::load_with_mtp(*recipe);
    auto started = start_engine(m, *recipe);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      RequestParams p;
      p.prompt = prompt;
      p.max_tokens = 16;
      auto got = run_single_request(*started->engine, std::move(p));
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_EQ(*got, *want);
    }
    const EngineMetrics metrics = started->engine->metrics();
    if (model == "glm5_next-tiny")
      EXPECT_EQ(metrics.prefix_cache_hits, 0);
    else
      EXPECT_EQ(metrics.prefix_cache_hits, 16) << "the second round reuses the prompt's two full blocks of 8";
    started->engine->drain();
  }
}

}  // namespace
}  // namespace kiln
