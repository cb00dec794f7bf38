// The oracle drafter behind `kiln bench decode --draft-profile` (apps/kiln/oracle_drafter.h) through the engine on
// the CPU, on the trained tiny model: drafted greedy output equals plain greedy output whatever the profile, a
// profile of ones accepts every draft, zeros accept none, and a middle profile's measured per-position conditional
// acceptance stays within a binomial bound of it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine_decode_run.h"
#include "model/model_loader.h"
#include "oracle_drafter.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::cli {
namespace {

// fp32 KV: a verification pass and single-token decoding agree exactly on the CPU.
Recipe tiny_recipe() {
  auto r = load_recipe("",
                       {"model.path=" + (std::filesystem::path(KILN_SOURCE_DIR) / "models/tiny-glm").string(),
                        "model.threads=1", "kv.layout=fp32", "kv.block_size=4", "scheduler.max_model_len=256",
                        "scheduler.max_num_seqs=4", "scheduler.max_num_batched_tokens=64"},
                       global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

struct TinyModel {
  Recipe recipe = tiny_recipe();
  LoadedModel m;
  TinyModel() {
    auto loaded = load_model(recipe, global_registry(), ModelLoadOptions{});
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    if (loaded.ok()) m = std::move(loaded).value();
  }
};

TinyModel& tiny() {
  static TinyModel* model = new TinyModel;  // loaded once for every test here
  return *model;
}

std::vector<std::vector<int32_t>> prompts(int64_t n) {
  std::vector<std::vector<int32_t>> p(n);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < 11 + 3 * b; ++i) p[b].push_back(static_cast<int32_t>((i * 37 + b * 101 + 5) % 4096));
  return p;
}

struct Drafted {
  EngineDecodeRun plain, drafted;
  OracleStats stats;
};

Drafted run(const std::vector<double>& profile, int64_t sequences, int64_t tokens) {
  TinyModel& t = tiny();
  Drafted d;
  const auto ps = prompts(sequences);
  auto bench = make_engine_bench(t.m, t.recipe, static_cast<int64_t>(profile.size()));
  EXPECT_TRUE(bench.ok()) << bench.status().to_string();
  if (!bench.ok()) return d;
  auto plain = run_engine_decode(t.m, *bench, ps, tokens);
  EXPECT_TRUE(plain.ok()) << plain.status().to_string();
  if (!plain.ok()) return d;
  d.plain = std::move(plain).value();
  auto recordings = ps;
  for (size_t b = 0; b < ps.size(); ++b)
    recordings[b].insert(recordings[b].end(), d.plain.outputs[b].begin(), d.plain.outputs[b].end());
  auto oracle = std::make_shared<OracleDrafter>(profile, recordings, t.m.model->vocab_size());
  auto drafted = run_engine_decode(t.m, *bench, ps, tokens, {}, oracle, static_cast<int64_t>(profile.size()));
  EXPECT_TRUE(drafted.ok()) << drafted.status().to_string();
  if (!drafted.ok()) return d;
  d.drafted = std::move(drafted).value();
  d.stats = oracle->stats();
  return d;
}

TEST(OracleDrafter, ExpectedTokensPerPassIsOnePlusTheSumOfThePrefixProducts) {
  EXPECT_NEAR(expected_tokens_per_pass({0.9, 0.8, 0.7, 0.6, 0.5}), 1 + 0.9 + 0.72 + 0.504 + 0.3024 + 0.1512, 1e-12);
  EXPECT_DOUBLE_EQ(expected_tokens_per_pass({1, 1, 1}), 4);
  EXPECT_DOUBLE_EQ(expected_tokens_per_pass({0, 1, 1}), 1);
}

TEST(OracleDrafter, AProfileOfOnesAcceptsEveryDraftAndChangesNothing) {
  const Drafted d = run({1, 1, 1}, 2, 40);
  ASSERT_EQ(d.drafted.outputs.size(), 2u);
  EXPECT_EQ(d.drafted.outputs, d.plain.outputs);
  const EngineMetrics& m = d.drafted.metrics;
  ASSERT_GT(m.spec_drafts, 0);
  EXPECT_EQ(m.spec_accepted_tokens, m.spec_draft_tokens);
  // Every pass but those near max_tokens (where the engine drafts fewer) carries all three.
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_GT(d.stats.reached[i], 0);
    EXPECT_EQ(d.stats.accepted[i], d.stats.reached[i]) << "position " << i;
  }
  EXPECT_EQ(d.stats.divergent_rows, 0);
  EXPECT_EQ(d.stats.unexpected_accepts, 0);
  // 40 tokens at 4 a pass: the first comes from the prompt's pass, the rest from ten passes at most.
  EXPECT_LE(m.spec_drafts, 2 * 10);
}

TEST(OracleDrafter, AProfileOfZerosAcceptsNothingAndChangesNothing) {
  const Drafted d = run({0, 0, 0, 0}, 2, 24);
  EXPECT_EQ(d.drafted.outputs, d.plain.outputs);
  const EngineMetrics& m = d.drafted.metrics;
  ASSERT_GT(m.spec_draft_tokens, 0);
  EXPECT_EQ(m.spec_accepted_tokens, 0);
  EXPECT_EQ(d.stats.accepted[0], 0);
  EXPECT_GT(d.stats.reached[0], 0);
  EXPECT_EQ(d.stats.reached[1], 0);  // never past a rejected first draft
  EXPECT_EQ(d.stats.divergent_rows, 0);
  EXPECT_EQ(d.stats.unexpected_accepts, 0);
}

TEST(OracleDrafter, AMiddleProfileIsMeasuredWithinABinomialBound) {
  const std::vector<double> profile = {0.8, 0.5, 0.3};
  const Drafted d = run(profile, 4, 200);
  EXPECT_EQ(d.drafted.outputs, d.plain.outputs);
  EXPECT_EQ(d.stats.divergent_rows, 0);
  EXPECT_EQ(d.stats.unexpected_accepts, 0);
  for (size_t i = 0; i < profile.size(); ++i) {
    const double n = static_cast<double>(d.stats.reached[i]);
    ASSERT_GT(n, 50) << "position " << i << ": too few passes reached it for the bound to mean anything";
    // 4.5 standard deviations of a binomial proportion (plus one count): a miss is a bug, not bad luck.
    const double bound = 4.5 * std::sqrt(profile[i] * (1 - profile[i]) / n) + 1 / n;
    EXPECT_NEAR(d.stats.conditional_rate(i), profile[i], bound) << "position " << i << " over " << n << " passes";
  }
  // The engine's own count of tokens per pass agrees with the profile's expectation within the same kind of bound.
  const EngineMetrics& m = d.drafted.metrics;
  const double per_pass = 1.0 + static_cast<double>(m.spec_accepted_tokens) / m.spec_drafts;
  EXPECT_NEAR(per_pass, expected_tokens_per_pass(profile), 0.25);
}

TEST(OracleDrafter, RefusesSampledSequences) {
  OracleDrafter oracle({0.5}, {{1, 2, 3, 4, 5}}, 16);
  const int32_t next[] = {2, 3};
  DraftStep step;
  DraftSequence s;
  s.seq_id = 7;
  s.num_rows = 2;
  s.next_tokens = next;
  s.depth = 1;
  s.temperature = 0.7f;
  step.seqs.push_back(s);
  std::vector<DraftProposal> out;
  const Status st = oracle.propose(step, out);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("greedy"), std::string::npos) << st.to_string();
}

TEST(OracleDrafter, ASequenceWithoutARecordingIsAnError) {
  OracleDrafter oracle({0.5}, {{1, 2, 3, 4, 5}}, 16);
  const int32_t next[] = {9, 9};
  DraftStep step;
  DraftSequence s;
  s.num_rows = 2;
  s.next_tokens = next;
  s.depth = 1;
  step.seqs.push_back(s);
  std::vector<DraftProposal> out;
  EXPECT_FALSE(oracle.propose(step, out).ok());
}

}  // namespace
}  // namespace kiln::cli
