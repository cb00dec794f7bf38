// scheduler.batch_invariant (engine/batch_engine.h, model/batch_invariance.h): the engine lowers its step and chunk
// limits to the runner's batch-invariance bound, refuses a max_num_seqs the bound cannot decode at once, and then
// every step it runs holds at most the bound's rows and every sequence at most chunk_rows tokens a step — prompts
// long and short, arriving together and one by one, repeated (prefix cache hits) — with output unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine_harness.h"
#include "recipe/recipe.h"
#include "plugin/registry.h"

namespace kiln::testing {
namespace {

constexpr int64_t kVocab = 89;

BatchInvariance bound_of(int64_t rows, int64_t logit_rows, int64_t chunk_rows) {
  BatchInvariance b;
  b.rows = rows, b.logit_rows = logit_rows, b.chunk_rows = chunk_rows;
  return b;
}

EngineConfig invariant_config(int64_t max_num_seqs, int64_t batched) {
  EngineConfig c = small_config(1024);
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = batched;
  c.batch_invariant = true;
  return c;
}

TEST(ApplyBatchInvariance, LowersTheStepAndChunkLimitsToTheBound) {
  // A runner's bound of 32 rows, 32 logit rows, chunks of 15 through its decode kernels.
  auto c = apply_batch_invariance(invariant_config(16, 2048), bound_of(32, 32, 15));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->max_num_batched_tokens, 32);
  EXPECT_EQ(c->max_chunk_tokens, 15);
  // The tighter of rows and logit rows (each chunk brings a logit row); a smaller recipe limit stays.
  c = apply_batch_invariance(invariant_config(4, 2048), bound_of(32, 8, 15));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_num_batched_tokens, 8);
  c = apply_batch_invariance(invariant_config(4, 20), bound_of(32, 32, 15));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_num_batched_tokens, 20);
  EXPECT_EQ(c->max_chunk_tokens, 15);
}

TEST(ApplyBatchInvariance, LeavesTheConfigAloneWhenOffOrUnbounded) {
  EngineConfig off = invariant_config(16, 2048);
  off.batch_invariant = false;
  auto c = apply_batch_invariance(off, bound_of(32, 32, 15));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_num_batched_tokens, 2048);
  EXPECT_EQ(c->max_chunk_tokens, 0);
  // The CPU runner: invariant at any size.
  c = apply_batch_invariance(invariant_config(64, 2048), BatchInvariance{});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_num_batched_tokens, 2048);
  EXPECT_EQ(c->max_chunk_tokens, 0);
}

TEST(ApplyBatchInvariance, RefusesWhatTheBoundCannotHold) {
  auto c = apply_batch_invariance(invariant_config(64, 2048), bound_of(32, 32, 15));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("scheduler.max_num_seqs (64)"), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().message().find("at most 32"), std::string::npos) << c.status().to_string();
  c = apply_batch_invariance(invariant_config(4, 2048), bound_of(0, 0, 15));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("scheduler.batch_invariant"), std::string::npos);
  // BatchEngine::create applies it: the same refusal before any thread starts.
  auto runner = std::make_unique<FakeModelRunner>(1024, 4, kVocab);
  runner->set_batch_invariance(bound_of(8, 8, 3));
  auto engine = BatchEngine::create(invariant_config(16, 64), std::move(runner));
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("max_num_seqs"), std::string::npos);
}

TEST(ApplyBatchInvariance, IsARecipeKeyOfTheSchedulerSection) {
  auto r = load_recipe("", {"model.path=models/tiny-glm", "scheduler.batch_invariant=true"}, global_registry());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto c = engine_config_from_recipe(r->section("scheduler"), 4096);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->batch_invariant);
  auto bad = load_recipe("", {"model.path=models/tiny-glm", "scheduler.batch_invariant=\"yes\""}, global_registry());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("batch_invariant"), std::string::npos) << bad.status().to_string();
}

std::vector<int32_t> prompt_of(int i, int64_t len) {
  std::vector<int32_t> p;
  for (int64_t t = 0; t < len; ++t) p.push_back(static_cast<int32_t>((i * 13 + t * 7 + 3) % kVocab));
  return p;
}

// Every call the runner saw: at most `rows` tokens, each sequence at most `chunk` of them.
void expect_steps_within(const FakeModelRunner& runner, int64_t rows, int64_t chunk, const std::string& where) {
  int64_t calls = 0, chunked = 0;
  for (const auto& call : runner.records()) {
    int64_t n = 0;
    for (const RecordedStep& s : call) {
      n += s.tokens;
      EXPECT_LE(s.tokens, chunk) << where << ": call " << calls;
      if (s.tokens > 1) ++chunked;
    }
    EXPECT_LE(n, rows) << where << ": call " << calls;
    ++calls;
  }
  EXPECT_GT(calls, 0) << where;
  EXPECT_GT(chunked, 0) << where << ": no prompt ran in chunks";
}

// Prompts of 1..40 tokens, beyond the bound's 8-row steps and 3-token chunks, all at once and then one by one (the
// second round's prompts hit the prefix cache): every step inside the bound, and the output the reference.
TEST(BatchInvariantEngine, EveryStepStaysInsideTheBoundAndOutputIsUnchanged) {
  for (const BatchInvariance& bound : {bound_of(8, 8, 3), bound_of(12, 6, 5)}) {
    const std::string where = "bound " + std::to_string(bound.rows) + "/" + std::to_string(bound.logit_rows) + "/" +
                              std::to_string(bound.chunk_rows);
    auto runner = std::make_unique<FakeModelRunner>(1024, 4, kVocab);
    runner->set_batch_invariance(bound);
    FakeModelRunner* r = runner.get();
    auto made = BatchEngine::create(invariant_config(4, 64), std::move(runner));
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    BatchEngine& engine = **made;
    EXPECT_EQ(engine.config().max_num_batched_tokens, std::min(bound.rows, bound.logit_rows)) << where;
    EXPECT_EQ(engine.config().max_chunk_tokens, bound.chunk_rows) << where;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int64_t> lengths;
    for (int i = 0; i < 7; ++i) {
      prompts.push_back(prompt_of(i, 1 + (i * 17) % 40));
      lengths.push_back(3 + i * 2);
    }
    const std::vector<Outcome> together = run_requests(engine, prompts, lengths);
    ASSERT_EQ(together.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(together[i].tokens, reference_tokens(prompts[i], lengths[i], {}, kVocab)) << where << " request " << i;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<Outcome> alone = run_requests(engine, {prompts[i]}, {lengths[i]});
      ASSERT_EQ(alone.size(), 1u);
      EXPECT_EQ(alone[0].tokens, together[i].tokens) << where << " request " << i << " alone";
    }
    const EngineMetrics m = wait_idle(engine);
    EXPECT_GT(m.prefix_cache_hits, 0) << where << ": the second round should reuse cached prompt blocks";
    EXPECT_TRUE(r->violations().empty()) << r->violations().front();
    expect_steps_within(*r, std::min(bound.rows, bound.logit_rows), bound.chunk_rows, where);
    engine.drain();
  }
}

}  // namespace
}  // namespace kiln::testing
