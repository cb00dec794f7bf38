// glm5_next through the engine (the one decode loop): greedy generation equals transformers' with the prompt
// chunked by the scheduler, two sequences at once keep their own state, prefix caching is off (and says why once),
// and the capacity report counts KV tokens from the DSA layers and state slots per sequence.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <future>
#include <sstream>

#include "common/glm5_next_test_model.h"
#include "common/test_model.h"
#include "engine/engine_factory.h"
#include "engine/single_request.h"

namespace kiln {
namespace {
using testing::load_glm5_next;
using testing::load_reference;
using testing::model_dir;
using testing::Reference;

std::vector<std::string> recipe_sets(const std::string& fixture, int64_t batched_tokens) {
  return {"model.path=" + model_dir(fixture).string(),
          "model.device=cpu",
          "kv.layout=fp32",
          "kv.block_size=16",
          "scheduler.max_num_seqs=2",
          "scheduler.max_model_len=256",
          "scheduler.max_num_batched_tokens=" + std::to_string(batched_tokens)};
}

TEST(Glm5NextEngine, GreedyMatchesTransformersWithChunkedPrompt) {
  for (const std::string& fixture : testing::glm5_next_fixtures()) {
    Reference ref = load_reference(fixture);
    LoadedModel m = load_glm5_next(fixture);
    const auto prompt = ref.ids("prompt_ids");
    const auto greedy = ref.ids("greedy_ids");
    for (int64_t chunk : {7, 64}) {
      auto ids = testing::engine_generate(m, recipe_sets(fixture, chunk), prompt, static_cast<int64_t>(greedy.size()));
      ASSERT_TRUE(ids.ok()) << ids.status().to_string();
      EXPECT_EQ(*ids, greedy) << fixture << ", chunks of " << chunk;
    }
  }
}

TEST(Glm5NextEngine, TwoRequestsAtOnceKeepTheirOwnState) {
  Reference ref = load_reference("glm5_next-tiny");
  LoadedModel m = load_glm5_next("glm5_next-tiny");
  const auto prompt = ref.ids("prompt_ids");
  const auto greedy = ref.ids("greedy_ids");
  auto recipe = load_recipe("", recipe_sets("glm5_next-tiny", 32), global_registry());
  ASSERT_TRUE(recipe.ok());
  auto e = start_engine(m, *recipe);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  std::vector<std::future<Result<std::vector<int32_t>>>> runs;
  for (int i = 0; i < 2; ++i) {
    RequestParams p;
    p.prompt = prompt;
    p.max_tokens = static_cast<int64_t>(greedy.size());
    runs.push_back(std::async(std::launch::async, [&, p] { return run_single_request(*e->engine, p); }));
  }
  for (auto& r : runs) {
    auto ids = r.get();
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, greedy);
  }
}

TEST(Glm5NextEngine, SaysOnceThatPrefixCachingIsOff) {
  LoadedModel m = load_glm5_next("glm5_next-tiny");
  auto recipe = load_recipe("", recipe_sets("glm5_next-tiny", 32), global_registry());
  ASSERT_TRUE(recipe.ok());
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  auto logger = spdlog::default_logger();
  const auto level = logger->level();
  logger->sinks().push_back(sink);
  logger->set_level(spdlog::level::info);
  {
    auto e = start_engine(m, *recipe);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    auto ids = run_single_request(*e->engine, RequestParams{.prompt = {5, 6, 7}, .max_tokens = 2});
    ASSERT_TRUE(ids.ok());
  }
  logger->sinks().pop_back();
  logger->set_level(level);
  const std::string text = captured.str();
  const std::string line = "prefix caching is off for glm5_next";
  ASSERT_NE(text.find(line), std::string::npos) << text;
  EXPECT_EQ(text.find(line, text.find(line) + 1), std::string::npos) << "said more than once:\n" << text;
  EXPECT_NE(text.find("recurrent state"), std::string::npos);
}

TEST(Glm5NextEngine, CapacityCountsDsaTokensAndStateSlots) {
  LoadedModel m = load_glm5_next("glm5_next-shared");
  auto recipe = load_recipe("", recipe_sets("glm5_next-shared", 32), global_registry());
  ASSERT_TRUE(recipe.ok());
  auto plan = plan_recipe(m, *recipe);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  // Three DSA layers hold a 32-wide fp32 latent per token, two of them also the indexer's [k | gate] (2 × 32 fp32)
  // and a 32-float pool key per 16 tokens; the three KDA layers hold nothing per token.
  EXPECT_EQ(plan->spec.bytes_per_token(m.layout->bytes_per_token()), 3u * 32 * 4 + 2u * (64 * 4 + 32 * 4 / 16));
  // Per sequence: three KDA layers' recurrent [4, 8, 8] and conv [3, 96] state, fp32, with a snapshot each.
  const uint64_t per_sequence = 3u * (4 * 8 * 8 + 3 * 96) * 4;
  EXPECT_EQ(plan->capacity.state_bytes, 2u * 2 * per_sequence);
  EXPECT_EQ(plan->capacity.max_num_seqs, 2);
  // max_num_seqs × max_model_len tokens (the CPU cap), in blocks of 16.
  EXPECT_EQ(plan->capacity.tokens(), 2 * 256);
  EXPECT_NE(plan->capacity.report().find("state slots for 2 sequences"), std::string::npos) << plan->capacity.report();
}

}  // namespace
}  // namespace kiln
