// A drafter that needs no model weights (the plugin template's n-gram prompt-lookup drafter) runs on a checkpoint
// without next-n layers (deepseek_v3-tiny), greedy output unchanged by its drafts; the MTP drafter on the same
// checkpoint is refused when the engine starts, naming what is missing.
#include <gtest/gtest.h>

#include "common/template_plugin.h"

#include "plugin/plugin_loader.h"
#include "speculative/speculative_test_support.h"

namespace kiln {
namespace {

using testing::model_dir;

void load_template_plugin() {
  const Status& loaded = testing::template_plugin_loaded();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string() << " (build the kiln-plugin-example target)";
}

std::vector<std::string> sets(const std::string& method) {
  std::vector<std::string> s = {"model.path=" + model_dir("deepseek_v3-tiny").string(), "kv.layout=fp32",
                                "kv.block_size=4", "speculative.method=" + method,
                                "speculative.depth=" + std::string(method == "none" ? "0" : "3")};
  // Match on the last token alone: the fixture's random weights rarely repeat a longer run.
  if (method == "ngram") s.push_back("speculative.ngram_size=1");
  return s;
}

TEST(WeightlessDrafter, NgramDraftsOnACheckpointWithoutNextNLayers) {
  load_template_plugin();
  auto recipe = load_recipe("", sets("ngram"), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), model_load_options(*recipe));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->model->num_mtp_layers(), 0);
  // A prompt that repeats itself, so prompt lookup finds continuations to propose.
  std::vector<int32_t> prompt;
  for (int r = 0; r < 4; ++r)
    for (int32_t t : {101, 57, 302, 88, 19, 240}) prompt.push_back(t);
  EngineMetrics metrics;
  auto drafted = testing::engine_generate(*m, sets("ngram"), prompt, 48, {}, {}, &metrics);
  ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
  auto plain = testing::engine_generate(*m, sets("none"), prompt, 48);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(*drafted, *plain);
  EXPECT_GT(metrics.spec_draft_tokens, 0) << "the n-gram drafter proposed nothing";
}

TEST(WeightlessDrafter, TheMtpDrafterOnTheSameCheckpointIsRefusedNamingTheMissingLayers) {
  testing::load_mtp_plugin();
  auto recipe = load_recipe("", sets("mtp"), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), model_load_options(*recipe));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto e = start_engine(*m, *recipe);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("MTP layer"), std::string::npos) << e.status().to_string();
  EXPECT_NE(e.status().message().find("speculative.method"), std::string::npos) << e.status().to_string();
}

}  // namespace
}  // namespace kiln
