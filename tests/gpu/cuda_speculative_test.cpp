// MTP speculative decoding on the CUDA runner. The GPU draft host runs the next-n layer as the CPU host does
// (logits and hidden states within the bf16 tolerance of the fixture tests), keeps its own paged KV (rollback
// frees pages), and through the engine greedy output with drafting at K = 1..5 equals plain decoding on the
// same GPU token for token, exactly (no near-tie allowance): on the trained tiny-glm (bf16) and on the
// glm4_moe_lite-tiny fixture, with concurrent requests of several prompt and output lengths, and with a long
// prompt through the prefill kernel. That rests on the runner's batch invariance (kBatchInvariantMaxRows in
// cuda_model_step.h, tested row by row in batch_invariance_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/engine_factory.h"
#include "engine/engine_harness.h"
#include "engine/generator.h"
#include "runtime/cuda/cuda_draft_host.h"
#include "speculative/speculative_test_support.h"

namespace kiln::testing {
namespace {
namespace fs = std::filesystem;

constexpr double kTolerance = 5e-2;  // max|Δ| / max|cpu|, as the fixture tests of the CUDA runner
constexpr float kRouterNearTie = 1e-2f;  // as there: a routing margin within reach of bf16's error

fs::path model_path(const std::string& name) {
  return name == "tiny-glm" ? fs::path(KILN_SOURCE_DIR) / "models/tiny-glm" : model_dir(name);
}

// Drafting is exactly lossless where every row a sequence brings to a step is computed as plain decoding computes
// it. The runner guarantees that for decode-path rows (decode, verification, prompt chunks under
// kPrefillMinTokens = 16 tokens) in steps of at most kBatchInvariantMaxRows = 32 rows, whatever shares the step;
// not for steps beyond 32 rows (cuBLAS picks its summation order by the row count) nor for prompt chunks of 16
// or more, whose prefill kernel expands the keys of all of the step's prefilling sequences in one cuBLAS GEMM.
// With drafting, steps carry other rows than without (and which requests a step admits depends on thread timing),
// so the engine settings keep every step inside the guarantee: `max_num_seqs` sequences, `batched` scheduled
// tokens a step, and at most K = 5 draft rows per decoding sequence give ≤ batched + 5 · max_num_seqs rows.
Recipe gpu_recipe(const std::string& model, int depth, int64_t max_num_seqs = 4, int64_t batched = 12) {
  load_mtp_plugin();
  std::vector<std::string> o = {"model.path=" + model_path(model).string(), "model.device=cuda", "kv.layout=bf16",
                                "kv.block_size=4", "scheduler.max_model_len=160",
                                "scheduler.max_num_seqs=" + std::to_string(max_num_seqs),
                                "scheduler.max_num_batched_tokens=" + std::to_string(batched)};
  if (depth > 0) {
    o.push_back("speculative.method=mtp");
    o.push_back("speculative.depth=" + std::to_string(depth));
  }
  auto r = load_recipe("", o, global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(want[i])));
  }
  return diff / ref;
}

TEST(CudaMtpDraftHost, RunsTheMtpLayerLikeTheCpuHost) {
  load_mtp_plugin();
  auto cpu_made = load_recipe("", {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "model.device=cpu",
                                   "kv.layout=bf16", "kv.block_size=4", "speculative.method=mtp", "speculative.depth=3",
                                   "speculative.draft_kv_dtype=bf16"},
                              global_registry());
  ASSERT_TRUE(cpu_made.ok()) << cpu_made.status().to_string();
  const Recipe& cpu_recipe = *cpu_made;
  LoadedModel cpu = load_with_mtp(cpu_recipe);
  const Recipe recipe = gpu_recipe("glm4_moe_lite-tiny", 3);
  auto gpu = load_model(recipe, global_registry(), model_load_options(recipe));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  ASSERT_NE(gpu->gpu, nullptr);
  ASSERT_EQ(gpu->gpu->num_mtp_layers(), 1);
  auto cpu_host = make_mtp_draft_host(cpu, cpu_recipe, global_registry(), 64);
  ASSERT_TRUE(cpu_host.ok()) << cpu_host.status().to_string();
  auto made = cuda::CudaMtpDraftHost::create(*gpu->gpu, 64, 4);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  DraftHost& g = **made;
  DraftHost& c = **cpu_host;
  EXPECT_EQ(g.num_draft_layers(), 1);
  EXPECT_EQ(g.hidden_size(), c.hidden_size());

  const int64_t H = c.hidden_size();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Two sequences: a 13-row "prefill" and a 5-row one, then recursive single-row steps on the layer's own output.
  std::vector<std::vector<int32_t>> tokens = {random_prompt(rng, 13, 4096), random_prompt(rng, 5, 4096)};
  std::vector<std::vector<float>> hidden(2);
  for (int s = 0; s < 2; ++s) {
    hidden[s].resize(tokens[s].size() * H);
    for (float& v : hidden[s]) v = normal(rng);
    ASSERT_TRUE(c.allocate(s).ok());
    ASSERT_TRUE(g.allocate(s).ok());
  }
  EXPECT_FALSE(g.allocate(0).ok());
  std::vector<DraftLayerRows> batch(2);
  for (int s = 0; s < 2; ++s)
    batch[s] = {s, 0, tokens[s].data(), hidden[s].data(), static_cast<int64_t>(tokens[s].size()), true};
  DraftLayerOutput co, go;
  ASSERT_TRUE(c.run(0, batch, co).ok());
  ASSERT_TRUE(g.run(0, batch, go).ok());
  ASSERT_EQ(go.first_row, co.first_row);
  // The same rows through the CPU model's MTP layer on a fresh cache, for each row's MoE routing margin: a row the
  // CPU routed by less than the bf16 path's error in the router scores may take the other expert on the GPU.
  const std::vector<float> margins = [&] {
    auto kv = make_kv_cache(cpu, 64);
    std::vector<std::vector<int32_t>> tables(2);
    std::vector<SequenceStep> steps;
    std::vector<float> prev;
    for (int s = 0; s < 2; ++s) {
      EXPECT_TRUE(kv->reserve(tables[s], static_cast<int64_t>(tokens[s].size())).ok());
      steps.push_back({tokens[s], 0, &tables[s], true});
      prev.insert(prev.end(), hidden[s].begin(), hidden[s].end());
    }
    StepOutput out;
    out.record_router_margin = true;
    EXPECT_TRUE(cpu.model->mtp_forward(0, steps, prev.data(), *kv, out).ok());
    EXPECT_LE(relative_error(out.logits, co.logits), 1e-4);  // the host runs the same layer
    return out.router_margin;
  }();
  const int64_t vocab = c.vocab_size(), rows = static_cast<int64_t>(margins.size());
  ASSERT_EQ(static_cast<int64_t>(co.logits.size()), rows * vocab);
  auto close_rows = [&](const std::vector<float>& got, const std::vector<float>& want, int64_t width) {
    std::vector<float> g2, w2;
    for (int64_t r = 0; r < rows; ++r)
      if (margins[r] >= kRouterNearTie) {
        g2.insert(g2.end(), got.begin() + r * width, got.begin() + (r + 1) * width);
        w2.insert(w2.end(), want.begin() + r * width, want.begin() + (r + 1) * width);
      }
    return relative_error(g2, w2);
  };
  const int64_t ties = std::count_if(margins.begin(), margins.end(), [](float m) { return m < kRouterNearTie; });
  EXPECT_LE(ties, rows / 2) << "rows routed by a near-tie: too few left to compare";  // 4 of 18 on the H200
  EXPECT_LE(close_rows(go.logits, co.logits, vocab), kTolerance) << ties << " near-tie rows left out";
  EXPECT_LE(close_rows(go.hidden, co.hidden, H), kTolerance) << ties << " near-tie rows left out";
  std::vector<int64_t> len = {13, 5};
  std::vector<int64_t> last_row = {12, 17};  // each sequence's newest row in the previous run's hidden output
  for (int step = 0; step < 4; ++step) {
    std::vector<int32_t> next(2);
    std::vector<std::vector<float>> h(2);
    for (int s = 0; s < 2; ++s) {
      next[s] = static_cast<int32_t>((101 * step + 17 * s + 3) % 4096);
      // Both sides condition on the CPU's hidden output, so the comparison stays per step.
      h[s].assign(co.hidden.begin() + last_row[s] * H, co.hidden.begin() + (last_row[s] + 1) * H);
      batch[s] = {s, len[s], &next[s], h[s].data(), 1, false};
      last_row[s] = s;
    }
    ASSERT_TRUE(c.run(0, batch, co).ok());
    ASSERT_TRUE(g.run(0, batch, go).ok());
    EXPECT_LE(relative_error(go.logits, co.logits), kTolerance) << "step " << step;
    EXPECT_LE(relative_error(go.hidden, co.hidden), kTolerance) << "step " << step;
    for (int s = 0; s < 2; ++s) EXPECT_EQ(*g.length(s), ++len[s]);
  }
  // Rollback frees pages; the rolled-back positions are rewritten like fresh ones.
  auto* host = dynamic_cast<cuda::CudaMtpDraftHost*>(&g);
  const int64_t free_before = host->free_blocks();
  ASSERT_TRUE(g.truncate(0, 6).ok());
  EXPECT_EQ(*g.length(0), 6);
  EXPECT_EQ(host->free_blocks(), free_before + 3);  // 17 positions (5 blocks of 4) → 6 (2 blocks)
  g.release(1);
  EXPECT_FALSE(g.length(1).ok());
  EXPECT_FALSE(g.run(1, batch, go).ok());
}

// Plain single-sequence GPU decoding of each prompt (what the engine must reproduce with drafting).
std::vector<std::vector<int32_t>> plain_gpu_generation(const LoadedModel& m,
                                                       const std::vector<std::vector<int32_t>>& prompts,
                                                       const std::vector<int64_t>& lengths) {
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto kv = make_kv_cache(m, 160);
    auto runner = m.gpu->make_runner(kv->num_blocks(), kv->block_size());
    EXPECT_TRUE(runner.ok());
    Generator g(*m.model, *kv, runner->get());
    GenerateOptions o;
    o.max_new_tokens = lengths[i];
    auto out = g.generate(prompts[i], o, nullptr);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    expected.push_back(out.ok() ? *out : std::vector<int32_t>{});
  }
  return expected;
}

// Serves `prompts` through the engine of `recipe` (drafting) and expects exactly `expected` for each.
void expect_engine_output(const LoadedModel& m, const Recipe& recipe, const std::string& model, int depth,
                          const std::vector<std::vector<int32_t>>& prompts, const std::vector<int64_t>& lengths,
                          const std::vector<std::vector<int32_t>>& expected) {
  auto started = start_engine(m, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  ASSERT_NE(started->drafter, nullptr);
  ASSERT_NE(dynamic_cast<cuda::CudaMtpDraftHost*>(started->draft_host.get()), nullptr);
  const std::vector<Outcome> outcomes = run_requests(*started->engine, prompts, lengths);
  ASSERT_EQ(outcomes.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome& o = outcomes[i];
    EXPECT_EQ(o.reason, FinishReason::kLength) << o.events.back().error;
    EXPECT_EQ(o.tokens, expected[i]) << model << ": request " << i << " at depth " << depth;
  }
  const EngineMetrics metrics = wait_idle(*started->engine);
  EXPECT_EQ(metrics.kv_blocks_used, 0);
  EXPECT_GT(metrics.spec_drafts, 0);
  EXPECT_LE(metrics.spec_accepted_tokens, metrics.spec_draft_tokens);
  std::printf("%s K=%d: %lld of %lld drafted tokens accepted\n", model.c_str(), depth,
              static_cast<long long>(metrics.spec_accepted_tokens), static_cast<long long>(metrics.spec_draft_tokens));
  if (model == "tiny-glm") EXPECT_GT(metrics.spec_accepted_tokens, 0);  // a trained MTP layer drafts usefully
  started->engine->drain();
}

LoadedModel load_gpu(const Recipe& recipe) {
  auto loaded = load_model(recipe, global_registry(), model_load_options(recipe));
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  return std::move(loaded).value();
}

class CudaSpeculativeEngine : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Concurrent requests whose prompts (2 .. 12 tokens) run the decode path, in steps of at most 12 + 5 · 4 = 32 rows.
TEST_P(CudaSpeculativeEngine, GreedyOutputEqualsNoDrafting) {
  const auto& [model, depth] = GetParam();
  const Recipe recipe = gpu_recipe(model, depth);
  const LoadedModel m = load_gpu(recipe);
  ASSERT_NE(m.gpu, nullptr);
  ASSERT_EQ(m.gpu->num_mtp_layers(), 1);
  const int64_t vocab = m.model->config().vocab_size;

  std::mt19937 rng(200 + depth);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(random_prompt(rng, 2 + 2 * i, vocab));
    lengths.push_back(1 + 6 * i);  // 1 .. 31 tokens: budgets shorter than K, and many passes
  }
  expect_engine_output(m, recipe, model, depth, prompts, lengths, plain_gpu_generation(m, prompts, lengths));
}

// One request with a 45-token prompt: it is the engine's only sequence, so its prompt runs as one chunk through
// the prefill kernel in a step of its own, as in plain generation (one forward of the whole prompt); then
// verification steps of 1 + K ≤ 6 rows.
TEST_P(CudaSpeculativeEngine, LongPromptGreedyOutputEqualsNoDrafting) {
  const auto& [model, depth] = GetParam();
  const Recipe recipe = gpu_recipe(model, depth, 1, 64);
  const LoadedModel m = load_gpu(recipe);
  ASSERT_NE(m.gpu, nullptr);
  std::mt19937 rng(300 + depth);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(rng, 45, m.model->config().vocab_size)};
  const std::vector<int64_t> lengths = {40};
  expect_engine_output(m, recipe, model, depth, prompts, lengths, plain_gpu_generation(m, prompts, lengths));
}

INSTANTIATE_TEST_SUITE_P(ModelsAndDepths, CudaSpeculativeEngine,
                         ::testing::Combine(::testing::Values("tiny-glm", "glm4_moe_lite-tiny"),
                                            ::testing::Values(1, 2, 3, 4, 5)));

// GLM-4.7-Flash shapes with dummy weights: the next-n layer is made on the device too, so a speculative recipe
// with model.load = "dummy" starts (what the serving benchmarks need).
TEST(CudaSpeculativeDummy, DummyLoadsMakeTheMtpLayer) {
  load_mtp_plugin();
  const fs::path dir = fs::temp_directory_path() / "kiln_gpu_mtp_dummy";
  fs::create_directories(dir);
  fs::copy_file(model_dir("glm4_moe_lite-tiny") / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  auto recipe = load_recipe("", {"model.path=" + dir.string(), "model.device=cuda", "model.load=dummy",
                                 "kv.layout=bf16", "kv.block_size=4", "scheduler.max_model_len=64",
                                 "scheduler.max_num_seqs=2", "speculative.method=mtp", "speculative.depth=3"},
                            global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), model_load_options(*recipe));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->gpu->num_mtp_layers(), 1);
  auto started = start_engine(*m, *recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  Collector c;
  RequestParams p;
  p.prompt = {5, 9, 100, 7};
  p.max_tokens = 12;
  ASSERT_TRUE(started->engine->submit(p, c.sink(0)).ok());
  ASSERT_TRUE(c.wait(0));
  EXPECT_EQ(c.get(0).tokens.size(), 12u);
  started->engine->drain();
}

}  // namespace
}  // namespace kiln::testing
