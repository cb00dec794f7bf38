// Speculative decoding inside the batching engine, on the tiny glm4_moe_lite fixture with its MTP layer:
// for every depth K = 1..5, concurrent requests (decodes verified alongside other sequences' prefill chunks)
// produce exactly the greedy tokens of plain single-sequence generation, and the KV pool ends empty.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "engine/batch_engine.h"
#include "engine/engine_factory.h"
#include "engine/mla_moe_runner.h"
#include "engine/generator.h"
#include "engine/engine_harness.h"
#include "speculative_test_support.h"
#include "plugin/registry.h"

namespace kiln::testing {
namespace {

Recipe spec_recipe(int depth, const std::string& method, const std::vector<std::string>& extra = {}) {
  load_mtp_plugin();
  std::vector<std::string> sets = {
      "model.path=" + (std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/models/glm4_moe_lite-tiny").string(),
      "kv.layout=fp32", "kv.block_size=4", "scheduler.max_model_len=128", "scheduler.max_num_seqs=4",
      "scheduler.max_num_batched_tokens=32", "speculative.method=" + method,
      "speculative.depth=" + std::to_string(depth)};
  sets.insert(sets.end(), extra.begin(), extra.end());
  auto recipe = load_recipe("", sets, global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  return std::move(recipe).value();
}

// Concurrent requests through an engine built from `recipe` (drafting at `depth`) against plain single-sequence
// generation of each prompt; `metrics`: the engine's once idle.
void expect_same_as_plain(const Recipe& recipe, int depth, EngineMetrics& metrics);

class SpeculativeEngine : public ::testing::TestWithParam<int> {};

TEST_P(SpeculativeEngine, GreedyOutputEqualsNoDrafting) {
  const int depth = GetParam();
  EngineMetrics metrics;
  ASSERT_NO_FATAL_FAILURE(expect_same_as_plain(spec_recipe(depth, "mtp"), depth, metrics));
  EXPECT_GT(metrics.spec_drafts, 0);
  EXPECT_GE(metrics.spec_draft_tokens, metrics.spec_drafts);
  EXPECT_LE(metrics.spec_accepted_tokens, metrics.spec_draft_tokens);
  ASSERT_FALSE(metrics.spec_drafted_per_pos.empty());
  EXPECT_LE(static_cast<int>(metrics.spec_drafted_per_pos.size()), depth);
}

// speculative.max_batch = 1: steps where several sequences decode run without drafts, the longest request's tail
// (decoding alone) drafts; output still equals plain generation, with fewer drafts than unlimited drafting.
TEST(SpeculativeEngineConfig, MaxBatchDraftsOnlyInSmallSteps) {
  EngineMetrics limited, always;
  ASSERT_NO_FATAL_FAILURE(expect_same_as_plain(spec_recipe(3, "mtp", {"speculative.max_batch=1"}), 3, limited));
  ASSERT_NO_FATAL_FAILURE(expect_same_as_plain(spec_recipe(3, "mtp"), 3, always));
  EXPECT_GT(limited.spec_drafts, 0);
  EXPECT_LT(limited.spec_draft_tokens, always.spec_draft_tokens);
}

void expect_same_as_plain(const Recipe& recipe, int depth, EngineMetrics& metrics) {
  auto loaded = load_model(recipe, global_registry(), model_load_options(recipe));
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const LoadedModel& m = *loaded;
  ASSERT_EQ(m.model->weights().mtp.size(), 1u);
  const int64_t vocab = m.model->config().vocab_size;

  std::mt19937 rng(100 + depth);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(random_prompt(rng, 2 + 7 * i, vocab));
    lengths.push_back(1 + 5 * i);  // 1 .. 26 tokens: budgets shorter than K, and many passes
  }
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto kv = make_kv_cache(m, 128);
    Generator g(*m.model, *kv);
    GenerateOptions o;
    o.max_new_tokens = lengths[i];
    auto out = g.generate(prompts[i], o, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    expected.push_back(*out);
  }

  auto started = start_engine(m, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  ASSERT_NE(started->drafter, nullptr);
  const std::vector<Outcome> outcomes = run_requests(*started->engine, prompts, lengths);
  ASSERT_EQ(outcomes.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome& o = outcomes[i];
    EXPECT_EQ(o.reason, FinishReason::kLength) << o.events.back().error;
    EXPECT_EQ(o.tokens, expected[i]) << "request " << i << " at depth " << depth;
    // Counters stay per-token even when a pass emits several.
    for (size_t e = 0; e < o.tokens.size(); ++e) EXPECT_EQ(o.events[e].completion_tokens, static_cast<int64_t>(e + 1));
  }
  metrics = wait_idle(*started->engine);
  EXPECT_EQ(metrics.kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Depths, SpeculativeEngine, ::testing::Values(1, 2, 3, 4, 5));

TEST(SpeculativeEngineConfig, DeepestDepthStarts) {
  // speculative.depth's maximum (16) is also the MTP drafter's; the engine's lookahead follows the depth.
  const Recipe recipe = spec_recipe(16, "mtp");
  auto loaded = load_model(recipe, global_registry(), model_load_options(recipe));
  ASSERT_TRUE(loaded.ok());
  auto started = start_engine(*loaded, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  EXPECT_EQ(started->engine->config().lookahead_slots, 16);
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// Knows each prompt's true greedy continuation and proposes it, corrupting every `wrong_every`-th draft so
// that passes accept all, some or none of their drafts.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(std::vector<std::vector<int32_t>> prompts, std::vector<std::vector<int32_t>> continuations,
                int wrong_every)
      : prompts_(std::move(prompts)), continuations_(std::move(continuations)), wrong_every_(wrong_every) {}

  DrafterCapabilities capabilities() const override {
    DrafterCapabilities c;
    c.max_depth = 8;
    c.target_hidden_layers = {-1};
    return c;
  }
  Status propose(const std::vector<DraftInput>& batch, int depth, std::vector<DraftOutput>& out) override {
    out.assign(batch.size(), {});
    for (size_t b = 0; b < batch.size(); ++b) {
      const DraftInput& in = batch[b];
      auto& h = history_[in.seq_id];
      if (in.start_position != static_cast<int64_t>(h.size()))
        return invalid_argument("oracle: sequence " + std::to_string(in.seq_id) + " skipped from " +
                                std::to_string(h.size()) + " to " + std::to_string(in.start_position));
      h.insert(h.end(), in.tokens, in.tokens + in.num_tokens);
      std::vector<int32_t> full = h;
      full.push_back(in.next_token);
      for (size_t p = 0; p < prompts_.size(); ++p) {
        const auto& prompt = prompts_[p];
        if (full.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), full.begin())) continue;
        const size_t done = full.size() - prompt.size();
        for (int k = 0; k < depth && done + k < continuations_[p].size(); ++k) {
          int32_t t = continuations_[p][done + k];
          if (++proposed_ % wrong_every_ == 0) t = (t + 1) % 4096;
          out[b].tokens.push_back(t);
        }
        break;
      }
    }
    return ok_status();
  }
  Status rollback(int64_t seq_id, int64_t length) override {
    auto& h = history_[seq_id];
    if (length < static_cast<int64_t>(h.size())) h.resize(length);
    return ok_status();
  }
  void release(int64_t seq_id) override { history_.erase(seq_id); }

 private:
  std::vector<std::vector<int32_t>> prompts_, continuations_;
  int wrong_every_;
  int64_t proposed_ = 0;
  std::map<int64_t, std::vector<int32_t>> history_;
};

TEST(SpeculativeEngineAcceptance, AcceptedDraftsStreamAsTheirOwnTokens) {
  load_mtp_plugin();
  auto recipe = load_recipe("", {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "kv.layout=fp32",
                                 "kv.block_size=4", "scheduler.max_model_len=128", "scheduler.max_num_seqs=4",
                                 "scheduler.max_num_batched_tokens=32"},
                            global_registry());
  ASSERT_TRUE(recipe.ok());
  auto loaded = load_model(*recipe, global_registry());
  ASSERT_TRUE(loaded.ok());
  const LoadedModel& m = *loaded;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(random_prompt(rng, 5 + 9 * i, m.model->config().vocab_size));
    auto kv = make_kv_cache(m, 128);
    Generator g(*m.model, *kv);
    GenerateOptions o;
    o.max_new_tokens = 20;
    auto out = g.generate(prompts.back(), o, nullptr);
    ASSERT_TRUE(out.ok());
    expected.push_back(*out);
  }
  for (int wrong_every : {1000, 3, 1}) {  // all right, mixed, all wrong
    auto plan = plan_engine(m, *recipe);
    ASSERT_TRUE(plan.ok());
    EngineConfig config = plan->config;
    config.speculative_depth = 4;
    config.lookahead_slots = 4;
    auto drafter = std::make_shared<OracleDrafter>(prompts, expected, wrong_every);
    auto engine = BatchEngine::create(
        config, std::make_unique<MlaMoeRunner>(*m.model, make_kv_cache(m, plan->capacity.tokens())), drafter);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    Collector c;
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestParams p;
      p.prompt = prompts[i];
      p.max_tokens = 20;
      ASSERT_TRUE((*engine)->submit(p, c.sink(static_cast<int>(i))).ok());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(c.wait(static_cast<int>(i)));
      EXPECT_EQ(c.get(static_cast<int>(i)).tokens, expected[i]) << "wrong_every " << wrong_every << " request " << i;
    }
    const EngineMetrics metrics = wait_idle(**engine);
    EXPECT_EQ(metrics.kv_blocks_used, 0);
    if (wrong_every == 1000) EXPECT_EQ(metrics.spec_accepted_tokens, metrics.spec_draft_tokens);
    if (wrong_every == 3) {
      EXPECT_GT(metrics.spec_accepted_tokens, 0);
      EXPECT_LT(metrics.spec_accepted_tokens, metrics.spec_draft_tokens);
    }
    if (wrong_every == 1) EXPECT_EQ(metrics.spec_accepted_tokens, 0);
  }
}

}  // namespace
}  // namespace kiln::testing
