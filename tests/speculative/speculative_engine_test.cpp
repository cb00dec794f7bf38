// Speculative decoding inside the batching engine, on the tiny glm4_moe_lite fixture with its MTP layer:
// for every depth K = 1..5, concurrent requests (decodes verified alongside other sequences' prefill chunks)
// produce exactly the greedy tokens of plain single-sequence generation, and the KV pool ends empty.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "engine/batch_engine.h"
#include "engine/engine_factory.h"
#include "engine/engine_harness.h"
#include "engine/instance_runner.h"
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
  LoadedModel& m = *loaded;
  ASSERT_EQ(m.model->num_mtp_layers(), 1);
  const int64_t vocab = m.info.vocab_size;

  std::mt19937 rng(100 + depth);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(random_prompt(rng, 2 + 7 * i, vocab));
    lengths.push_back(1 + 5 * i);  // 1 .. 26 tokens: budgets shorter than K, and many passes
  }
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(greedy_reference(m, prompts[i], lengths[i]));

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
  // A pass writes K + 1 rows, and the next-n layer's recursive rows reach K − 1 past them before the next step.
  EXPECT_EQ(started->engine->config().lookahead_slots, 32);
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// Knows each prompt's true greedy continuation and proposes it, corrupting every `wrong_every`-th draft so
// that passes accept all, some or none of their drafts. It rebuilds each sequence's tokens from the rows it is
// shown, so it also checks the engine shows every row once and in order.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(std::vector<std::vector<int32_t>> prompts, std::vector<std::vector<int32_t>> continuations,
                int wrong_every)
      : prompts_(std::move(prompts)), continuations_(std::move(continuations)), wrong_every_(wrong_every) {}

  DrafterCapabilities capabilities() const override {
    DrafterCapabilities c;
    c.max_depth = 8;
    c.tap_layers = {kTapFinalNormed};
    return c;
  }
  Status propose(const DraftStep& step, std::vector<DraftProposal>& out) override {
    out.assign(step.seqs.size(), {});
    for (size_t b = 0; b < step.seqs.size(); ++b) {
      const DraftSequence& s = step.seqs[b];
      auto& h = history_[s.seq_id];  // tokens at positions 1, 2, ... (position 0 is never shown)
      if (s.start_position > static_cast<int64_t>(h.size()))
        return invalid_argument("oracle: sequence " + std::to_string(s.seq_id) + " skipped from " +
                                std::to_string(h.size()) + " to " + std::to_string(s.start_position));
      h.resize(s.start_position);
      h.insert(h.end(), s.next_tokens, s.next_tokens + s.num_rows);
      if (step.taps.size() != 1 || step.taps[0].dim(0) < s.tap_row + s.num_rows)
        return invalid_argument("oracle: the step's taps do not cover the rows");
      for (size_t p = 0; p < prompts_.size(); ++p) {
        const auto& prompt = prompts_[p];
        if (h.size() + 1 < prompt.size() || !std::equal(prompt.begin() + 1, prompt.end(), h.begin())) continue;
        const size_t done = h.size() + 1 - prompt.size();
        for (int k = 0; k < s.depth && done + k < continuations_[p].size(); ++k) {
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

struct OracleRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;  // per request, per token (with logprobs ≥ 0)
  EngineMetrics metrics;
};

OracleRun run_with_oracle(LoadedModel& m, const Recipe& recipe, const std::vector<std::vector<int32_t>>& prompts,
                          const std::vector<std::vector<int32_t>>& truth, int wrong_every, int depth, int64_t max_tokens,
                          const std::vector<int32_t>& stop = {}, int32_t logprobs = -1,
                          const SamplingOptions& sampling = {}) {
  OracleRun run;
  auto plan = plan_engine(m, recipe);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  if (!plan.ok()) return run;
  plan->config.speculative_depth = depth;
  plan->config.lookahead_slots = depth;
  auto caches = make_cache_manager(m, *plan);
  EXPECT_TRUE(caches.ok());
  if (!caches.ok()) return run;
  auto drafter = std::make_shared<OracleDrafter>(prompts, truth, wrong_every);
  auto engine = BatchEngine::create(plan->config, std::make_unique<InstanceRunner>(*m.model, **caches), drafter, *caches);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return run;
  Collector c;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = max_tokens;
    p.stop_token_ids = stop;
    p.logprobs = logprobs;
    p.sampling = sampling;
    EXPECT_TRUE((*engine)->submit(p, c.sink(static_cast<int>(i))).ok());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(c.wait(static_cast<int>(i)));
    const Outcome o = c.get(static_cast<int>(i));
    run.tokens.push_back(o.tokens);
    run.logprobs.emplace_back();
    for (const TokenEvent& e : o.events)
      if (e.token >= 0 && e.has_logprobs) run.logprobs.back().push_back(e.logprob);
  }
  run.metrics = wait_idle(**engine);
  return run;
}

Recipe plain_recipe() {
  auto recipe = load_recipe("", {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "kv.layout=fp32",
                                 "kv.block_size=4", "scheduler.max_model_len=128", "scheduler.max_num_seqs=4",
                                 "scheduler.max_num_batched_tokens=32"},
                            global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  return std::move(recipe).value();
}

TEST(SpeculativeEngineAcceptance, AcceptedDraftsStreamAsTheirOwnTokens) {
  const Recipe recipe = plain_recipe();
  auto loaded = load_model(recipe, global_registry());
  ASSERT_TRUE(loaded.ok());
  LoadedModel& m = *loaded;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(random_prompt(rng, 5 + 9 * i, m.info.vocab_size));
    expected.push_back(greedy_reference(m, prompts.back(), 20));
  }
  for (int wrong_every : {1000, 3, 1}) {  // all right, mixed, all wrong
    const OracleRun run = run_with_oracle(m, recipe, prompts, expected, wrong_every, 4, 20);
    ASSERT_EQ(run.tokens.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(run.tokens[i], expected[i]) << "wrong_every " << wrong_every << " request " << i;
    EXPECT_EQ(run.metrics.kv_blocks_used, 0);
    if (wrong_every == 1000) EXPECT_EQ(run.metrics.spec_accepted_tokens, run.metrics.spec_draft_tokens);
    if (wrong_every == 3) {
      EXPECT_GT(run.metrics.spec_accepted_tokens, 0);
      EXPECT_LT(run.metrics.spec_accepted_tokens, run.metrics.spec_draft_tokens);
    }
    if (wrong_every == 1) EXPECT_EQ(run.metrics.spec_accepted_tokens, 0);
  }
}

// A verified draft's logprob comes from the target's own row for its position: whether drafts are all accepted
// (rows 0..K of verification passes) or all rejected (every token a correction from row 0), each token's logprob
// is the same, and the greedy token is the row's most likely one.
TEST(SpeculativeEngineAcceptance, LogprobsOfVerifiedTokensComeFromTheTargetRows) {
  const Recipe recipe = plain_recipe();
  auto loaded = load_model(recipe, global_registry());
  ASSERT_TRUE(loaded.ok());
  LoadedModel& m = *loaded;
  std::mt19937 rng(6);
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 2; ++i) {
    prompts.push_back(random_prompt(rng, 7 + 5 * i, m.info.vocab_size));
    expected.push_back(greedy_reference(m, prompts.back(), 16));
  }
  const OracleRun accepted = run_with_oracle(m, recipe, prompts, expected, 1000, 4, 16, {}, 2);
  const OracleRun rejected = run_with_oracle(m, recipe, prompts, expected, 1, 4, 16, {}, 2);
  EXPECT_GT(accepted.metrics.spec_accepted_tokens, 0);
  EXPECT_EQ(rejected.metrics.spec_accepted_tokens, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(accepted.tokens[i], expected[i]);
    ASSERT_EQ(accepted.logprobs[i].size(), expected[i].size());
    ASSERT_EQ(rejected.logprobs[i].size(), expected[i].size());
    for (size_t t = 0; t < expected[i].size(); ++t) {
      EXPECT_NEAR(accepted.logprobs[i][t], rejected.logprobs[i][t], 1e-4) << "request " << i << " token " << t;
      EXPECT_LE(accepted.logprobs[i][t], 0.0f);
    }
  }
}

// Penalties and logit_bias written out the plain way (every vocabulary entry, counts from scratch): the reference the
// engine's per-row adjustments are checked against.
void reference_penalties(const SamplingOptions& o, size_t prompt_len, const std::vector<int32_t>& tokens, float* row,
                         int64_t vocab) {
  for (int64_t v = 0; v < vocab; ++v) {
    float x = row[v];
    for (const auto& [token, bias] : o.logit_bias)
      if (token == v) x += bias;
    int64_t in_prompt = 0, in_output = 0;
    for (size_t t = 0; t < tokens.size(); ++t)
      if (tokens[t] == v) ++(t < prompt_len ? in_prompt : in_output);
    if (in_prompt + in_output > 0) x = x > 0 ? x / o.repetition_penalty : x * o.repetition_penalty;
    x -= o.frequency_penalty * static_cast<float>(in_output) + o.presence_penalty * (in_output > 0 ? 1.0f : 0.0f);
    row[v] = x;
  }
}

// Greedy decoding with presence, frequency and repetition penalties and logit_bias: the engine gives the reference's
// tokens without drafts and with drafts that are all accepted, all rejected or mixed (row t of a verification pass
// must see the penalties of the history up to draft t), and the penalties change what is generated.
TEST(SpeculativeEnginePenalties, GreedyOutputEqualsTheReferenceWithOrWithoutDrafts) {
  const Recipe recipe = plain_recipe();
  auto loaded = load_model(recipe, global_registry());
  ASSERT_TRUE(loaded.ok());
  LoadedModel& m = *loaded;
  SamplingOptions o;
  o.frequency_penalty = 0.9f;
  o.presence_penalty = 0.4f;
  o.repetition_penalty = 1.4f;
  o.logit_bias = {{7, 2.5f}, {11, -100.0f}, {7, 3.0f}};  // a repeated token keeps its last value
  SamplingOptions effective = o;
  effective.logit_bias = {{7, 3.0f}, {11, -100.0f}};
  std::mt19937 rng(21);
  std::vector<std::vector<int32_t>> prompts, expected;
  bool changed = false;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(random_prompt(rng, 5 + 6 * i, m.info.vocab_size));
    const size_t prompt_len = prompts.back().size();
    expected.push_back(greedy_reference(m, prompts.back(), 24, 1 << 20, {},
                                        [&](const std::vector<int32_t>& tokens, float* row, int64_t vocab) {
                                          reference_penalties(effective, prompt_len, tokens, row, vocab);
                                        }));
    changed = changed || expected.back() != greedy_reference(m, prompts.back(), 24);
    EXPECT_EQ(std::count(expected.back().begin(), expected.back().end(), 11), 0) << "a -100 bias leaves it out";
  }
  EXPECT_TRUE(changed) << "the penalties should change some greedy continuation";
  for (const int wrong_every : {1000, 1, 3}) {
    const OracleRun run = run_with_oracle(m, recipe, prompts, expected, wrong_every, 4, 24, {}, -1, o);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(run.tokens[i], expected[i]) << "request " << i << ", every " << wrong_every << "th draft wrong";
    if (wrong_every == 1000) EXPECT_GT(run.metrics.spec_accepted_tokens, 0);
    if (wrong_every == 1) EXPECT_EQ(run.metrics.spec_accepted_tokens, 0);
  }
  // And through the MTP drafter of the checkpoint, at depth 3.
  LoadedModel with_mtp = load_with_mtp(mtp_recipe("glm4_moe_lite-tiny", 3));
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto got = engine_generate(with_mtp, mtp_sets("glm4_moe_lite-tiny", 3), prompts[i], 24, o);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, expected[i]) << "request " << i << " with MTP drafts";
  }
}

// One request, drafts always right at depth 3: one prompt pass, then passes of 1 + 3 tokens; every draft accepted.
TEST(SpeculativeEngineAcceptance, MetricsCountAcceptance) {
  const Recipe recipe = plain_recipe();
  auto loaded = load_model(recipe, global_registry());
  ASSERT_TRUE(loaded.ok());
  std::mt19937 rng(9);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(rng, 8, loaded->info.vocab_size)};
  const std::vector<std::vector<int32_t>> expected = {greedy_reference(*loaded, prompts[0], 25)};
  const OracleRun run = run_with_oracle(*loaded, recipe, prompts, expected, 1000, 3, 25);
  ASSERT_EQ(run.tokens.size(), 1u);
  EXPECT_EQ(run.tokens[0], expected[0]);
  // The first token comes from the prompt pass; 24 more in passes of 4.
  EXPECT_EQ(run.metrics.spec_drafts, 6);
  EXPECT_EQ(run.metrics.spec_accepted_tokens, run.metrics.spec_draft_tokens);
  ASSERT_EQ(run.metrics.spec_accepted_per_pos.size(), 3u);
  EXPECT_EQ(run.metrics.spec_accepted_per_pos[2], run.metrics.spec_drafted_per_pos[2]);
}

// A stop token among accepted drafts ends the request there: the tokens after it in the same pass are dropped.
TEST(SpeculativeEngineAcceptance, StopTokenEndsMidPass) {
  const Recipe recipe = plain_recipe();
  auto loaded = load_model(recipe, global_registry());
  ASSERT_TRUE(loaded.ok());
  std::mt19937 rng(9);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(rng, 8, loaded->info.vocab_size)};
  const std::vector<int32_t> expected = greedy_reference(*loaded, prompts[0], 25);
  const int32_t stop = expected[6];
  const std::vector<int32_t> want(expected.begin(), std::find(expected.begin(), expected.end(), stop) + 1);
  const OracleRun run = run_with_oracle(*loaded, recipe, prompts, {expected}, 1000, 4, 25, {stop});
  ASSERT_EQ(run.tokens.size(), 1u);
  EXPECT_EQ(run.tokens[0], want);
  EXPECT_EQ(run.metrics.kv_blocks_used, 0);
}

// Sampled requests with MTP drafts: a seed fixes the output (the same request twice gives the same tokens), every
// token is a vocabulary id, and drafting happened.
TEST(SpeculativeEngineSampling, MtpSamplingIsSeededAndValid) {
  load_mtp_plugin();
  const Recipe recipe = spec_recipe(4, "mtp");
  auto loaded = load_model(recipe, global_registry(), model_load_options(recipe));
  ASSERT_TRUE(loaded.ok());
  auto started = start_engine(*loaded, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::mt19937 rng(10);
  const auto prompt = random_prompt(rng, 9, loaded->info.vocab_size);
  std::vector<std::vector<int32_t>> outs;
  for (int run = 0; run < 2; ++run) {
    RequestParams p;
    p.prompt = prompt;
    p.max_tokens = 20;
    p.sampling = {0.8f, 0, 0.95f, 1234};
    auto got = run_single_request(*started->engine, p);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    outs.push_back(*got);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0].size(), 20u);
  for (int32_t t : outs[0]) EXPECT_TRUE(t >= 0 && t < loaded->info.vocab_size);
  EXPECT_GT(started->engine->metrics().spec_draft_tokens, 0);
}

}  // namespace
}  // namespace kiln::testing
