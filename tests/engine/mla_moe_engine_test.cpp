// The engine over the real CPU model (the tiny glm4_moe_lite fixture): batched, prefix-cached serving yields
// the tokens of single-sequence generation.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/engine_factory.h"
#include "common/test_model.h"
#include "engine_harness.h"
#include "plugin/registry.h"

namespace kiln::testing {
namespace {

Recipe tiny_recipe(std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {
      "model.path=" + (std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/models/glm4_moe_lite-tiny").string(),
      "kv.layout=fp32",
      "kv.block_size=4",
      "scheduler.max_model_len=128",
      "scheduler.max_num_seqs=4",
      "scheduler.max_num_batched_tokens=16"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  auto recipe = load_recipe("", overrides, global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  return std::move(recipe).value();
}

TEST(MlaMoeEngine, BatchedServingMatchesSingleSequenceGeneration) {
  const Recipe recipe = tiny_recipe();
  auto loaded = load_model(recipe, global_registry());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  LoadedModel& m = *loaded;
  const int64_t vocab = m.info.vocab_size;

  std::mt19937 rng(17);
  const auto shared = random_prompt(rng, 12, vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    auto p = random_prompt(rng, 3 + 5 * i, vocab);
    if (i % 2 == 0) p.insert(p.begin(), shared.begin(), shared.end());  // shared prefix: cache hits
    prompts.push_back(std::move(p));
  }
  constexpr int64_t kNew = 6;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(greedy_reference(m, p, kNew));

  auto started = start_engine(m, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  EXPECT_EQ(started->capacity.tokens(), 4 * 128);  // the CPU cap: max_num_seqs × max_model_len
  Collector c;
  // The first request runs alone and fills the prefix cache; the rest arrive together.
  RequestParams first;
  first.prompt = prompts[0];
  first.max_tokens = kNew;
  ASSERT_TRUE(started->engine->submit(first, c.sink(0)).ok());
  ASSERT_TRUE(c.wait(0));
  for (size_t i = 1; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = kNew;
    ASSERT_TRUE(started->engine->submit(p, c.sink(static_cast<int>(i))).ok());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(c.wait(static_cast<int>(i)));
    const Outcome o = c.get(static_cast<int>(i));
    EXPECT_EQ(o.reason, FinishReason::kLength) << o.events.back().error;
    EXPECT_EQ(o.tokens, expected[i]) << "request " << i;
  }
  const EngineMetrics metrics = wait_idle(*started->engine);
  EXPECT_GE(metrics.prefix_cache_hits, 2 * 12);
  EXPECT_EQ(metrics.kv_blocks_used, 0);
}

TEST(MlaMoeEngine, RefusesAScheduleBeyondTheModel) {
  const Recipe recipe = tiny_recipe({"scheduler.max_model_len=1000000"});
  auto loaded = load_model(recipe, global_registry());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  auto started = start_engine(*loaded, recipe);
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.status().message().find("max_position_embeddings"), std::string::npos)
      << started.status().message();
}

}  // namespace
}  // namespace kiln::testing
