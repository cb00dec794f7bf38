// The engine over the real CPU model (the tiny glm4_moe_lite fixture): batched, prefix-cached serving yields
// the tokens of single-sequence generation.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/engine_factory.h"
#include "engine/single_request.h"
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

// Temperature 0 on the embedded default recipe (configs/tiny-cpu.toml: bf16 KV in 16-token pages): the same request
// repeated in one engine (the repeats served from the prefix cache but for their last tokens), in an engine without
// prefix caching, and in one that prefills in chunks of 16, gives the same text. (Before the CPU model attended in
// one MLA form whatever the chunk's length, a cached prefix changed the form of the rest and so the tokens.)
TEST(MlaMoeEngine, GreedyOutputDoesNotDependOnCachingOrChunking) {
  const std::string file = (std::filesystem::path(KILN_SOURCE_DIR) / "configs/tiny-cpu.toml").string();
  auto recipe_with = [&](std::vector<std::string> sets) {
    auto r = load_recipe(file, sets, global_registry());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::move(r).value();
  };
  const Recipe cached = recipe_with({});
  auto loaded = load_model(cached, global_registry());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  std::mt19937 rng(29);
  const std::vector<int32_t> prompt = random_prompt(rng, 101, loaded->info.vocab_size);
  auto generate = [&](const Recipe& recipe, int times, EngineMetrics* metrics = nullptr) {
    auto started = start_engine(*loaded, recipe);
    EXPECT_TRUE(started.ok()) << started.status().to_string();
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < times; ++i) {
      RequestParams p;
      p.prompt = prompt;
      p.max_tokens = 32;
      auto r = run_single_request(*started->engine, std::move(p));
      EXPECT_TRUE(r.ok()) << r.status().to_string();
      out.push_back(r.ok() ? *r : std::vector<int32_t>{});
    }
    if (metrics) *metrics = started->engine->metrics();
    return out;
  };
  EngineMetrics m;
  const auto repeated = generate(cached, 3, &m);
  EXPECT_GE(m.prefix_cache_hits, 2 * 96);  // the repeats reused six full pages each
  const auto uncached = generate(recipe_with({"scheduler.prefix_caching=false"}), 1);
  const auto chunked = generate(recipe_with({"scheduler.max_num_batched_tokens=16"}), 1);
  ASSERT_EQ(repeated[0].size(), 32u);
  EXPECT_EQ(repeated[1], repeated[0]);
  EXPECT_EQ(repeated[2], repeated[0]);
  EXPECT_EQ(uncached[0], repeated[0]);
  EXPECT_EQ(chunked[0], repeated[0]);
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
