// The oracle drafter of `kiln bench decode --draft-profile` (apps/kiln/oracle_drafter.h) through the engine on the
// CUDA runner, on the trained tiny model: drafted greedy output equals plain greedy output on the same GPU token
// for token, the engine's rows never leave the plain run's recording, and each pass accepts exactly the drafts the
// oracle made correct. The engine settings keep every step inside the runner's batch-invariant regime (as
// cuda_speculative_test.cpp explains: ≤ 32 rows a step, prompt chunks under 33 tokens).
#include <gtest/gtest.h>

#include <filesystem>

#include "engine_decode_run.h"
#include "model/model_loader.h"
#include "oracle_drafter.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::cli {
namespace {

Recipe cuda_tiny_recipe(int64_t max_num_seqs = 4, int64_t batched = 12) {
  auto r = load_recipe("",
                       {"model.path=" + (std::filesystem::path(KILN_SOURCE_DIR) / "models/tiny-glm").string(),
                        "model.device=cuda", "kv.layout=bf16", "kv.block_size=4", "scheduler.max_model_len=160",
                        "scheduler.max_num_seqs=" + std::to_string(max_num_seqs),
                        "scheduler.max_num_batched_tokens=" + std::to_string(batched)},
                       global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

void expect_lossless_with(const std::vector<double>& profile) {
  const Recipe recipe = cuda_tiny_recipe();
  auto m = load_model(recipe, global_registry(), ModelLoadOptions{});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(m->on_gpu());
  std::vector<std::vector<int32_t>> prompts(3);
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t i = 0; i < 9 + 4 * b; ++i) prompts[b].push_back(static_cast<int32_t>((i * 53 + b * 211 + 7) % 4096));
  auto bench = make_engine_bench(*m, recipe, static_cast<int64_t>(profile.size()));
  ASSERT_TRUE(bench.ok()) << bench.status().to_string();
  auto plain = run_engine_decode(*m, *bench, prompts, 64);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto recordings = prompts;
  for (size_t b = 0; b < prompts.size(); ++b)
    recordings[b].insert(recordings[b].end(), plain->outputs[b].begin(), plain->outputs[b].end());
  auto oracle = std::make_shared<OracleDrafter>(profile, recordings, m->model->vocab_size());
  auto drafted = run_engine_decode(*m, *bench, prompts, 64, {}, oracle, static_cast<int64_t>(profile.size()));
  ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
  EXPECT_EQ(drafted->outputs, plain->outputs);
  const OracleStats& s = oracle->stats();
  EXPECT_EQ(s.divergent_rows, 0);
  EXPECT_EQ(s.unexpected_accepts, 0);
  EXPECT_GT(s.passes, 0);
  EXPECT_GT(drafted->metrics.spec_drafts, 0);
}

// Batch 16 at K5 would verify 96 rows a pass, three times the runner's bound (32 rows: tiny-glm's vocabulary and
// projections are all narrow enough for the batch-invariant kernels): the engine verifies at depth 1 while all 16
// decode and deeper as they finish, and the output stays the plain output. Prompts of 9..15 tokens stay on the
// decode path (under kPrefillMinTokens), 24 scheduled tokens a step keep plain steps inside the bound too.
TEST(CudaOracleDrafter, Batch16K5StaysInsideTheBatchInvariantBound) {
  const Recipe recipe = cuda_tiny_recipe(16, 24);
  auto m = load_model(recipe, global_registry(), ModelLoadOptions{});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(m->on_gpu());
  const BatchInvariance bound = m->model->batch_invariance();
  EXPECT_EQ(bound.rows, 32);
  EXPECT_EQ(bound.logit_rows, 32);
  const std::vector<double> profile = {0.9, 0.8, 0.7, 0.6, 0.5};
  std::vector<std::vector<int32_t>> prompts(16);
  for (int64_t b = 0; b < 16; ++b)
    for (int64_t i = 0; i < 9 + b % 7; ++i) prompts[b].push_back(static_cast<int32_t>((i * 53 + b * 211 + 7) % 4096));
  auto bench = make_engine_bench(*m, recipe, 5);
  ASSERT_TRUE(bench.ok()) << bench.status().to_string();
  auto plain = run_engine_decode(*m, *bench, prompts, 48);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto recordings = prompts;
  for (size_t b = 0; b < prompts.size(); ++b)
    recordings[b].insert(recordings[b].end(), plain->outputs[b].begin(), plain->outputs[b].end());
  auto oracle = std::make_shared<OracleDrafter>(profile, recordings, m->model->vocab_size());
  auto drafted = run_engine_decode(*m, *bench, prompts, 48, {}, oracle, 5);
  ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
  EXPECT_EQ(drafted->outputs, plain->outputs);
  EXPECT_EQ(oracle->stats().divergent_rows, 0);
  EXPECT_EQ(oracle->stats().unexpected_accepts, 0);
  const EngineMetrics& dm = drafted->metrics;
  EXPECT_GT(dm.spec_drafts, 0);
  EXPECT_GT(dm.spec_bound_limited_steps, 0);
  EXPECT_LT(static_cast<double>(dm.spec_draft_tokens) / dm.spec_drafts, 5.0) << "the passes should have run shallower";
}

TEST(CudaOracleDrafter, K5ProfileDraftsLosslessly) { expect_lossless_with({0.9, 0.8, 0.7, 0.6, 0.5}); }
TEST(CudaOracleDrafter, K3ProfileOfOnesDraftsLosslessly) { expect_lossless_with({1, 1, 1}); }
TEST(CudaOracleDrafter, K3ProfileOfZerosDraftsLosslessly) { expect_lossless_with({0, 0, 0}); }

}  // namespace
}  // namespace kiln::cli
