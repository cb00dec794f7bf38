// The modality path through the engine on the CPU model: a request's media rows replace their placeholders'
// embeddings in whichever step computes them (one prompt step or several chunks), and the prefix cache keys the
// blocks holding a media item by its content hash, so a different image behind the same placeholder tokens never
// reuses another's KV while the same image does. Malformed media spans are refused at submit.
#include <gtest/gtest.h>

#include <random>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "engine/engine_factory.h"
#include "engine/single_request.h"

namespace kiln {
namespace {

using testing::load_recipe_model;
using testing::model_dir;

constexpr int64_t kBlock = 4;

std::vector<std::string> sets(int64_t batched_tokens = 2048, bool prefix_caching = true) {
  return {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "model.device=cpu", "kv.layout=fp32",
          "kv.block_size=" + std::to_string(kBlock), "scheduler.max_num_seqs=2",
          "scheduler.max_num_batched_tokens=" + std::to_string(batched_tokens),
          std::string("scheduler.prefix_caching=") + (prefix_caching ? "true" : "false")};
}

std::vector<int32_t> prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 23; ++i) p.push_back(static_cast<int32_t>(11 + 37 * i % 900));
  return p;
}

// An item over prompt tokens [5, 15): a begin marker, 8 placeholders, an end marker; rows random from `seed`.
RequestMedia media(uint64_t seed, int64_t hidden) {
  RequestMedia m;
  m.position = 5, m.length = 10, m.first_placeholder = 1, m.num_embeddings = 8;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  m.embeddings.resize(m.num_embeddings * hidden);
  for (float& v : m.embeddings) v = normal(rng);
  m.hash = 0x9e3779b97f4a7c15ull * (seed + 1);
  return m;
}

// Greedy tokens of one request straight through the model's step, the media rows handed to the prompt step.
std::vector<int32_t> reference(LoadedModel& m, const std::vector<int32_t>& prompt, const RequestMedia& item,
                               int64_t max_tokens) {
  const int64_t total = static_cast<int64_t>(prompt.size()) + max_tokens;
  testing::TestKv kv(m, total);
  std::vector<int32_t> table, tokens = prompt, out;
  EXPECT_TRUE(kv.reserve(table, total).ok());
  const MediaRows rows{item.position + item.first_placeholder, item.num_embeddings, item.embeddings.data()};
  int64_t computed = 0;
  StepOptions o;
  o.want_logits = true;
  const int64_t vocab = m.model->vocab_size();
  while (static_cast<int64_t>(out.size()) < max_tokens) {
    const int64_t n = static_cast<int64_t>(tokens.size()) - computed;
    SequenceStep step{std::span<const int32_t>(tokens.data() + computed, n), computed, &table, false};
    if (computed == 0) step.media = {&rows, 1};
    StepOutput r;
    EXPECT_TRUE(m.model->step({&step, 1}, {}, kv.views(), o, r).ok());
    computed += n;
    const int32_t next = static_cast<int32_t>(std::max_element(r.logits.begin(), r.logits.begin() + vocab) - r.logits.begin());
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

Result<std::vector<int32_t>> generate(StartedEngine& e, const std::vector<int32_t>& prompt,
                                      std::vector<RequestMedia> items, int64_t max_tokens) {
  RequestParams p;
  p.prompt = prompt;
  p.media = std::move(items);
  p.max_tokens = max_tokens;
  return run_single_request(*e.engine, std::move(p));
}

TEST(MediaPath, MediaRowsReplaceTheirPlaceholdersWhetherThePromptRunsInOneStepOrInChunks) {
  LoadedModel m = load_recipe_model(sets());
  const int64_t hidden = m.info.hidden_size;
  const RequestMedia item = media(1, hidden);
  const std::vector<int32_t> want = reference(m, prompt(), item, 8);
  // The media changes the output (so the rows did land), and the engine reproduces the direct step exactly, with the
  // prompt in one step and in chunks of 3 that split the item across four steps.
  LoadedModel plain_model = load_recipe_model(sets());
  EXPECT_NE(want, testing::greedy_reference(plain_model, prompt(), 8));
  for (int64_t chunk : {2048, 3}) {
    auto recipe = load_recipe("", sets(chunk), global_registry());
    ASSERT_TRUE(recipe.ok());
    auto e = start_engine(m, *recipe);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    auto got = generate(*e, prompt(), {item}, 8);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, want) << "prompt chunks of " << chunk;
  }
}

TEST(MediaPath, ThePrefixCacheSharesBlocksOnlyBehindTheSameMedia) {
  LoadedModel m = load_recipe_model(sets());
  const int64_t hidden = m.info.hidden_size;
  const RequestMedia a = media(1, hidden), b = media(2, hidden);
  const std::vector<int32_t> want_a = reference(m, prompt(), a, 6), want_b = reference(m, prompt(), b, 6);
  ASSERT_NE(want_a, want_b);

  auto recipe = load_recipe("", sets(), global_registry());
  ASSERT_TRUE(recipe.ok());
  auto e = start_engine(m, *recipe);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto hits = [&] { return e->engine->metrics().prefix_cache_hits; };
  auto got_a = generate(*e, prompt(), {a}, 6);
  ASSERT_TRUE(got_a.ok());
  EXPECT_EQ(*got_a, want_a);
  const int64_t after_a = hits();
  // The same placeholder tokens behind another image: only the block before the item (positions 0..3) is shared.
  auto got_b = generate(*e, prompt(), {b}, 6);
  ASSERT_TRUE(got_b.ok());
  EXPECT_EQ(*got_b, want_b);
  EXPECT_EQ(hits() - after_a, kBlock);
  // The first image again: every full block of the prompt is reused, and the output is unchanged.
  const int64_t after_b = hits();
  auto again = generate(*e, prompt(), {a}, 6);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, want_a);
  EXPECT_GT(hits() - after_b, kBlock);
}

TEST(MediaPath, MalformedMediaSpansAreRefusedAtSubmit) {
  LoadedModel m = load_recipe_model(sets());
  const int64_t hidden = m.info.hidden_size;
  auto recipe = load_recipe("", sets(), global_registry());
  ASSERT_TRUE(recipe.ok());
  auto e = start_engine(m, *recipe);
  ASSERT_TRUE(e.ok());
  ASSERT_NE(e->modality, nullptr);  // the recipe's modality (`text`), made for the server's request path
  auto refused = [&](RequestMedia item, const std::string& words) {
    RequestParams p;
    p.prompt = prompt();
    p.media = {std::move(item)};
    auto id = e->engine->submit(std::move(p), [](const TokenEvent&) { return true; });
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find(words), std::string::npos) << id.status().to_string();
  };
  RequestMedia past_end = media(1, hidden);
  past_end.position = 20;
  refused(past_end, "not inside the prompt");
  RequestMedia too_many = media(1, hidden);
  too_many.num_embeddings = 10;
  refused(too_many, "exceed its 10 tokens");
  RequestMedia short_rows = media(1, hidden);
  short_rows.embeddings.resize(short_rows.embeddings.size() - 1);
  refused(short_rows, "embedding values for 8 rows of width");
}

}  // namespace
}  // namespace kiln
