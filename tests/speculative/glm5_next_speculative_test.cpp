// Speculative decoding over glm5_next's recurrent KDA state: the engine snapshots the state slots before a
// verification pass and restores them after a rejection (BatchEngine), so a drafter that needs no weights (the
// plugin template's n-gram prompt lookup) leaves the greedy output unchanged. On a checkpoint without the next-n
// layer (glm5_next-tiny, like a Hugging Face export) the MTP drafter is refused at start; drafting with the layer is
// glm5_next_mtp_test.cpp.
#include <gtest/gtest.h>

#include "common/template_plugin.h"

#include "common/glm5_next_test_model.h"
#include "plugin/plugin_loader.h"
#include "speculative/speculative_test_support.h"

namespace kiln {
namespace {

using testing::model_dir;

void load_template_plugin() {
  const Status& loaded = testing::template_plugin_loaded();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string() << " (build the kiln-plugin-example target)";
}

std::vector<std::string> sets(const std::string& method, int depth = 3) {
  std::vector<std::string> s = {"model.path=" + model_dir("glm5_next-tiny").string(),
                                "model.device=cpu",
                                "model.threads=1",
                                "kv.layout=fp32",
                                "kv.block_size=16",
                                "scheduler.max_model_len=512",
                                "scheduler.max_num_seqs=2",
                                "speculative.method=" + method,
                                "speculative.depth=" + std::to_string(method == "none" ? 0 : depth)};
  if (method == "ngram") s.push_back("speculative.ngram_size=1");
  return s;
}

TEST(Glm5NextSpeculative, NgramDraftsLeaveGreedyOutputUnchangedAtDepths1To5) {
  load_template_plugin();
  auto recipe = load_recipe("", sets("ngram"), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), model_load_options(*recipe));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  std::vector<int32_t> prompt;  // repeats itself, so prompt lookup finds continuations to propose
  for (int r = 0; r < 6; ++r)
    for (int32_t t : {101, 57, 302, 88, 19, 240, 7, 411}) prompt.push_back(t);
  auto plain = testing::engine_generate(*m, sets("none"), prompt, 40);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  for (int depth = 1; depth <= 5; ++depth) {
    SCOPED_TRACE("depth " + std::to_string(depth));
    EngineMetrics metrics;
    auto drafted = testing::engine_generate(*m, sets("ngram", depth), prompt, 40, {}, {}, &metrics);
    ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
    EXPECT_EQ(*drafted, *plain);
    EXPECT_GT(metrics.spec_draft_tokens, 0) << "the n-gram drafter proposed nothing";
    EXPECT_LT(metrics.spec_accepted_tokens, metrics.spec_draft_tokens) << "no draft was rejected: nothing rolled back";
  }
}

TEST(Glm5NextSpeculative, TheMtpDrafterIsRefusedNamingTheMissingLayers) {
  testing::load_mtp_plugin();
  auto recipe = load_recipe("", sets("mtp"), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), model_load_options(*recipe));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto e = start_engine(*m, *recipe);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("MTP"), std::string::npos) << e.status().to_string();
}

}  // namespace
}  // namespace kiln
