// MTP speculative decoding on the CUDA runner. The next-n layer runs through the engine's DraftServices on the GPU
// as on the CPU (logits and hidden states within the bf16 tolerance of the fixture tests, in the target's pages), and
// through the engine greedy output with drafting at K = 1..5 equals plain decoding on the same GPU token for token,
// exactly (no near-tie allowance): on the trained tiny-glm (bf16) and on the glm4_moe_lite-tiny fixture, with
// concurrent requests of several prompt and output lengths, and with a long prompt through the prefill kernel. That
// rests on the runner's batch invariance (kBatchInvariantMaxRows in cuda_model_step.h, tested row by row in
// batch_invariance_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/engine_draft_services.h"
#include "engine/engine_factory.h"
#include "engine/engine_harness.h"
#include "speculative/speculative_test_support.h"

namespace kiln::testing {
namespace {
namespace fs = std::filesystem;

constexpr double kTolerance = 5e-2;      // max|Δ| / max|cpu|, as the fixture tests of the CUDA runner
constexpr float kRouterNearTie = 1e-2f;  // as there: a routing margin within reach of bf16's error

fs::path model_path(const std::string& name) {
  return name == "tiny-glm" ? fs::path(KILN_SOURCE_DIR) / "models/tiny-glm" : model_dir(name);
}

// Drafting is exactly lossless where every row a sequence brings to a step is computed as plain decoding computes
// it. The runner guarantees that for decode-path rows (decode, verification, prompt chunks under
// kPrefillMinTokens = 33 tokens) in steps of at most kBatchInvariantMaxRows = 32 rows, whatever shares the step;
// not for steps beyond 32 rows (cuBLAS picks its summation order by the row count) nor for prompt chunks of 33
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

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  return want.empty() ? 0.0 : relative_error(got.data(), want.data(), static_cast<int64_t>(want.size()));
}

// The next-n layer through DraftServices::mtp_run on the GPU and on the CPU: two sequences (a 13-row and a 5-row
// batch entry), then recursive single-row steps, each conditioned on the CPU's hidden output so the comparison
// stays per step.
TEST(CudaDraftServices, RunTheMtpLayerLikeTheCpu) {
  load_mtp_plugin();
  const std::vector<std::string> sets = {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "kv.layout=bf16",
                                         "kv.block_size=4"};
  std::vector<std::string> cpu_sets = sets, gpu_sets = sets;
  cpu_sets.push_back("model.device=cpu");
  gpu_sets.push_back("model.device=cuda");
  LoadedModel cpu = load_recipe_model(cpu_sets, {.load_mtp = true});
  LoadedModel gpu = load_recipe_model(gpu_sets, {.load_mtp = true});
  ASSERT_TRUE(gpu.on_gpu());
  ASSERT_EQ(gpu.model->num_mtp_layers(), 1);
  TestKv cpu_kv(cpu, 128), gpu_kv(gpu, 128);
  EngineDraftServices c(*cpu.model, cpu.format, cpu.info.num_layers, "");
  EngineDraftServices g(*gpu.model, gpu.format, gpu.info.num_layers, "");
  c.attach(&cpu_kv.manager(), static_cast<int64_t>(cpu_kv.views().layers.size()));
  g.attach(&gpu_kv.manager(), static_cast<int64_t>(gpu_kv.views().layers.size()));
  const int64_t H = c.hidden_size(), V = c.vocab_size();
  ASSERT_EQ(g.hidden_size(), H);

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<int32_t>> tokens = {random_prompt(rng, 13, V), random_prompt(rng, 5, V)};
  std::vector<std::vector<int32_t>> ctables(2), gtables(2);
  std::vector<std::vector<float>> hidden(2);
  for (int s = 0; s < 2; ++s) {
    hidden[s].resize(tokens[s].size() * H);
    for (float& v : hidden[s]) v = normal(rng);
    ASSERT_TRUE(cpu_kv.reserve(ctables[s], 32).ok());
    ASSERT_TRUE(gpu_kv.reserve(gtables[s], 32).ok());
  }
  // Device copies of the hidden rows the GPU side conditions on.
  auto to_device = [&](const std::vector<float>& h) {
    auto p = gpu.device->allocate(h.size() * 4, "test rows");
    EXPECT_TRUE(p.ok());
    EXPECT_TRUE(gpu.device->copy(*p, h.data(), h.size() * 4, true).ok());
    return static_cast<const float*>(*p);
  };
  auto run = [&](EngineDraftServices& svc, std::vector<std::vector<int32_t>>& tables,
                 const std::vector<const float*>& rows, const std::vector<int64_t>& start,
                 const std::vector<std::vector<int32_t>>& toks, bool all_logits, std::vector<float>& logits,
                 std::vector<float>& hid, bool on_device) {
    std::vector<MtpRows> batch;
    int64_t n = 0, logit_rows = 0;
    for (int s = 0; s < 2; ++s) {
      const int64_t k = static_cast<int64_t>(toks[s].size());
      batch.push_back({tables[s].data(), static_cast<int64_t>(tables[s].size()), start[s], toks[s].data(), rows[s], 0, k,
                       all_logits});
      n += k;
      logit_rows += all_logits ? k : 1;
    }
    MtpOutput out;
    ASSERT_TRUE(svc.mtp_run(0, batch, out).ok());
    logits.resize(logit_rows * V);
    hid.resize(n * H);
    if (on_device) {
      ASSERT_TRUE(gpu.device->copy(logits.data(), out.logits, logits.size() * 4, false).ok());
      ASSERT_TRUE(gpu.device->copy(hid.data(), out.hidden, hid.size() * 4, true).ok());
    } else {
      std::copy_n(out.logits, logits.size(), logits.begin());
      std::copy_n(out.hidden, hid.size(), hid.begin());
    }
  };
  std::vector<float> cl, chid, gl, ghid;
  run(c, ctables, {hidden[0].data(), hidden[1].data()}, {0, 0}, tokens, true, cl, chid, false);
  run(g, gtables, {to_device(hidden[0]), to_device(hidden[1])}, {0, 0}, tokens, true, gl, ghid, true);
  // Each row's MoE routing margin from the CPU model itself: a row the CPU routed by less than the bf16 path's
  // error in the router scores may take the other expert on the GPU.
  // Each row's MoE routing margin, from the CPU model's own MTP layer on a fresh cache: a row the CPU routed by less
  // than the bf16 path's error in the router scores may take the other expert on the GPU, a discrete change.
  std::vector<float> margins;
  {
    TestKv kv(cpu, 64);
    std::vector<std::vector<int32_t>> tables(2);
    std::vector<SequenceStep> steps;
    std::vector<float> prev;
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(kv.reserve(tables[s], static_cast<int64_t>(tokens[s].size())).ok());
      steps.push_back({tokens[s], 0, &tables[s], true});
      prev.insert(prev.end(), hidden[s].begin(), hidden[s].end());
    }
    StepOutput out;
    ASSERT_TRUE(cpu_model(cpu).mtp_forward(0, steps, prev.data(), kv.views(), out, true).ok());
    EXPECT_LE(rel_error(out.logits, cl), 1e-4);  // the services run the same layer
    margins = out.router_margin;
  }
  const int64_t rows = static_cast<int64_t>(cl.size()) / V;
  ASSERT_EQ(static_cast<int64_t>(margins.size()), rows);
  auto close_rows = [&](const std::vector<float>& got, const std::vector<float>& want, int64_t width) {
    std::vector<float> g2, w2;
    for (int64_t r = 0; r < rows; ++r)
      if (margins[r] >= kRouterNearTie) {
        g2.insert(g2.end(), got.begin() + r * width, got.begin() + (r + 1) * width);
        w2.insert(w2.end(), want.begin() + r * width, want.begin() + (r + 1) * width);
      }
    return rel_error(g2, w2);
  };
  const int64_t ties = std::count_if(margins.begin(), margins.end(), [](float m) { return m < kRouterNearTie; });
  EXPECT_LE(ties, rows / 2) << "rows routed by a near-tie: too few left to compare";
  EXPECT_LE(close_rows(gl, cl, V), kTolerance) << ties << " near-tie rows left out";
  EXPECT_LE(close_rows(ghid, chid, H), kTolerance) << ties << " near-tie rows left out";
  std::vector<int64_t> len = {13, 5}, last = {12, 17};
  for (int step = 0; step < 4; ++step) {
    std::vector<std::vector<int32_t>> next(2);
    std::vector<std::vector<float>> h(2);
    for (int s = 0; s < 2; ++s) {
      next[s] = {static_cast<int32_t>((101 * step + 17 * s + 3) % V)};
      h[s].assign(chid.begin() + last[s] * H, chid.begin() + (last[s] + 1) * H);
      last[s] = s;
    }
    run(c, ctables, {h[0].data(), h[1].data()}, len, next, false, cl, chid, false);
    run(g, gtables, {to_device(h[0]), to_device(h[1])}, len, next, false, gl, ghid, true);
    EXPECT_LE(rel_error(gl, cl), kTolerance) << "step " << step;
    EXPECT_LE(rel_error(ghid, chid), kTolerance) << "step " << step;
    for (int s = 0; s < 2; ++s) ++len[s];
  }
  std::printf("next-n layer, GPU vs CPU: %lld rows, %lld routed by a near-tie left out, then 4 steps, within %.0e\n",
              static_cast<long long>(rows), static_cast<long long>(ties), kTolerance);
}

// Serves `prompts` through the engine of `recipe` (drafting) and expects exactly `expected` for each.
void expect_engine_output(const LoadedModel& m, const Recipe& recipe, const std::string& model, int depth,
                          const std::vector<std::vector<int32_t>>& prompts, const std::vector<int64_t>& lengths,
                          const std::vector<std::vector<int32_t>>& expected) {
  auto started = start_engine(m, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  ASSERT_NE(started->drafter, nullptr);
  ASSERT_NE(started->draft_services, nullptr);
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

// Plain single-sequence GPU decoding of each prompt in one prefill step (what the engine must reproduce).
std::vector<std::vector<int32_t>> plain_gpu_generation(LoadedModel& m, const std::vector<std::vector<int32_t>>& prompts,
                                                       const std::vector<int64_t>& lengths) {
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(greedy_reference(m, prompts[i], lengths[i]));
  return expected;
}

class CudaSpeculativeEngine : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Concurrent requests whose prompts (2 .. 12 tokens) run the decode path, in steps of at most 12 + 5 · 4 = 32 rows.
TEST_P(CudaSpeculativeEngine, GreedyOutputEqualsNoDrafting) {
  const auto& [model, depth] = GetParam();
  const Recipe recipe = gpu_recipe(model, depth);
  LoadedModel m = load_gpu(recipe);
  ASSERT_TRUE(m.on_gpu());
  ASSERT_EQ(m.model->num_mtp_layers(), 1);
  const int64_t vocab = m.info.vocab_size;

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
  LoadedModel m = load_gpu(recipe);
  ASSERT_TRUE(m.on_gpu());
  std::mt19937 rng(300 + depth);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(rng, 45, m.info.vocab_size)};
  const std::vector<int64_t> lengths = {40};
  expect_engine_output(m, recipe, model, depth, prompts, lengths, plain_gpu_generation(m, prompts, lengths));
}

INSTANTIATE_TEST_SUITE_P(ModelsAndDepths, CudaSpeculativeEngine,
                         ::testing::Combine(::testing::Values("tiny-glm", "glm4_moe_lite-tiny"),
                                            ::testing::Values(1, 2, 3, 4, 5)));

// Sampled requests with MTP drafts on the GPU (drafts and their sparse q sampled on the device, rejection sampling
// on the device): a seed fixes the output, and drafting happened.
TEST(CudaSpeculativeSampling, SeededRequestsRepeat) {
  const Recipe recipe = gpu_recipe("tiny-glm", 4);
  LoadedModel m = load_gpu(recipe);
  auto started = start_engine(m, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::mt19937 rng(10);
  const auto prompt = random_prompt(rng, 9, m.info.vocab_size);
  std::vector<std::vector<int32_t>> outs;
  for (int run = 0; run < 2; ++run) {
    RequestParams p;
    p.prompt = prompt;
    p.max_tokens = 24;
    p.sampling = {0.8f, 0, 0.95f, 1234};
    auto got = run_single_request(*started->engine, p);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    outs.push_back(*got);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0].size(), 24u);
  EXPECT_GT(started->engine->metrics().spec_draft_tokens, 0);
}

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
  ASSERT_EQ(m->model->num_mtp_layers(), 1);
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
