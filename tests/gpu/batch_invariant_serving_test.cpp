// scheduler.batch_invariant on the CUDA runner: through the engine, a request's tokens and their logprobs are bitwise
// the same whether its prompt was prefilled beside three others, alone, or alone again over its cached prefix — the
// engine keeps every step inside the runner's bound (32 rows, prompt chunks of 32 tokens through the decode kernels),
// where nothing a row computes depends on the other rows (batch_invariance_test.cpp tests that row by row). On
// tiny-glm (trained), the glm4_moe_lite-tiny fixture, GLM-5's DSA indexer (glm_moe_dsa-tiny), and a q_proj fixture
// with 3 heads of width 20: its head widths are not 16-byte multiples, so its absorption and o_proj run cuBLAS and
// the runner promises only one-row steps — the engine then serves one sequence at a time, one prompt token a step,
// and holds the promise. And glm5_next (KDA layers through the recurrent kernel below 17 tokens, DSA layers with the
// pooled indexer; dummy weights; no prefix cache: its recurrent state recomputes). Without the key the same runs print how many logprobs differ (the prefill GEMMs then follow
// the step's row count), which is what the key is for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <random>

#include "common/reference_fixture.h"
#include "engine/engine_factory.h"
#include "engine/engine_harness.h"
#include "model/batch_invariance.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::testing {
namespace {
namespace fs = std::filesystem;

struct Run {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// glm5_next shapes the CUDA runner takes (KDA heads of 128): KDA, DSA with its own indexer, DSA sharing it, KDA.
constexpr const char* kGlm5NextConfig = R"({
  "model_type": "glm5_next", "architectures": ["Glm5NextForConditionalGeneration"], "tie_word_embeddings": false,
  "text_config": {"model_type": "glm5_next_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
    "q_lora_rank": 64, "kv_lora_rank": 128, "qk_nope_head_dim": 32, "v_head_dim": 32, "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "max_position_embeddings": 4096, "pad_token_id": 0,
    "tie_word_embeddings": false,
    "layer_types": ["linear_attention", "deepseek_sparse_attention", "deepseek_sparse_attention", "linear_attention"],
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "indexer_types": ["full", "full", "shared", "full"],
    "linear_num_heads": 2, "linear_head_dim": 128, "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0,
    "hc_mult": 4, "index_n_heads": 4, "index_head_dim": 128, "index_kpool": 16, "index_topk": 32}
})";

Recipe recipe_of(const std::string& model, bool invariant, int64_t max_num_seqs) {
  fs::path path;
  std::string load = "mmap";
  if (model == "tiny-glm") {
    path = fs::path(KILN_SOURCE_DIR) / "models/tiny-glm";
  } else if (model == "glm5_next-dummy") {
    path = fs::temp_directory_path() / "kiln_gpu_batch_invariant_glm5_next";
    fs::create_directories(path);
    std::ofstream(path / "config.json") << kGlm5NextConfig;
    load = "dummy";
  } else {
    path = model_dir(model);
  }
  auto r = load_recipe("",
                       {"model.path=" + path.string(), "model.load=" + load, "model.device=cuda", "kv.layout=bf16",
                        "kv.block_size=16",
                        "scheduler.max_model_len=256",
                        "scheduler.max_num_seqs=" + std::to_string(max_num_seqs),
                        "scheduler.max_num_batched_tokens=512",
                        std::string("scheduler.batch_invariant=") + (invariant ? "true" : "false")},
                       global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

// Submits `which` of the prompts at once, each for `length` greedy tokens with their logprobs.
std::vector<Run> serve(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, const std::vector<size_t>& which,
                       int64_t length) {
  Collector c;
  for (size_t k = 0; k < which.size(); ++k) {
    RequestParams p;
    p.prompt = prompts[which[k]];
    p.max_tokens = length;
    p.logprobs = 0;
    const auto submitted = engine.submit(p, c.sink(static_cast<int>(k)));
    EXPECT_TRUE(submitted.ok()) << submitted.status().to_string();
    if (!submitted.ok()) return {};
  }
  std::vector<Run> runs;
  for (size_t k = 0; k < which.size(); ++k) {
    EXPECT_TRUE(c.wait(static_cast<int>(k)));
    const Outcome o = c.get(static_cast<int>(k));
    EXPECT_EQ(o.reason, FinishReason::kLength) << (o.events.empty() ? "" : o.events.back().error);
    Run r;
    for (const TokenEvent& e : o.events)
      if (e.token >= 0) {
        EXPECT_TRUE(e.has_logprobs);
        r.tokens.push_back(e.token);
        r.logprobs.push_back(e.logprob);
      }
    runs.push_back(std::move(r));
  }
  return runs;
}

bool bitwise_equal(const Run& a, const Run& b) {
  return a.tokens == b.tokens && a.logprobs.size() == b.logprobs.size() &&
         std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float)) == 0;
}

struct Rounds {
  std::vector<Run> together, alone, cached;
  int64_t cache_hits = 0;
};

// Round 1 on a fresh engine: every prompt at once. Rounds 2 and 3 on another fresh engine: each prompt alone,
// twice (the second time over the prefix cache where the model has one).
Rounds run_rounds(const std::string& model, bool invariant, int64_t max_num_seqs,
                  const std::vector<std::vector<int32_t>>& prompts, int64_t length) {
  const Recipe recipe = recipe_of(model, invariant, max_num_seqs);
  auto loaded = load_model(recipe, global_registry(), model_load_options(recipe));
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  if (!loaded.ok()) return {};
  Rounds r;
  std::vector<size_t> all(prompts.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  {
    auto started = start_engine(*loaded, recipe);
    EXPECT_TRUE(started.ok()) << started.status().to_string();
    if (!started.ok()) return {};
    r.together = serve(*started->engine, prompts, all, length);
    started->engine->drain();
  }
  auto started = start_engine(*loaded, recipe);
  EXPECT_TRUE(started.ok()) << started.status().to_string();
  if (!started.ok()) return {};
  for (size_t i = 0; i < prompts.size(); ++i) r.alone.push_back(serve(*started->engine, prompts, {i}, length).at(0));
  for (size_t i = 0; i < prompts.size(); ++i) r.cached.push_back(serve(*started->engine, prompts, {i}, length).at(0));
  r.cache_hits = wait_idle(*started->engine).prefix_cache_hits;
  started->engine->drain();
  return r;
}

class BatchInvariantServing : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariantServing, OutputIsBitwiseIndependentOfBatchingChunkingAndTheCache) {
  const std::string model = GetParam();
  const Recipe probe = recipe_of(model, true, 1);
  auto info = load_model(probe, global_registry(), model_load_options(probe));
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_TRUE(info->on_gpu());
  const BatchInvariance bound = info->model->batch_invariance();
  const bool narrow_heads = model == "glm4_moe_lite-h3-qproj";
  EXPECT_EQ(bound.rows, narrow_heads ? 1 : 32) << model;
  // Prompt chunks stay on the decode kernels up to kCudaBatchInvariantChunkRows (32) tokens; glm5_next's KDA layers
  // run their recurrent kernel up to kKdaDecodeMaxTokens (16) tokens and the chunked scan beyond.
  const int64_t chunk_rows = model.rfind("glm5_next", 0) == 0 ? 16 : kCudaBatchInvariantChunkRows;
  EXPECT_EQ(bound.chunk_rows, narrow_heads ? 1 : chunk_rows) << model;
  const int64_t seqs = std::min<int64_t>(4, bound.rows);
  if (seqs < 4) {  // more sequences than the bound decodes at once are refused, naming the key
    const Recipe wide = recipe_of(model, true, 4);
    auto refused = start_engine(*info, wide);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("scheduler.max_num_seqs (4)"), std::string::npos)
        << refused.status().to_string();
  }
  std::mt19937 rng(4242);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : {23, 40, 61, 90}) prompts.push_back(random_prompt(rng, len, info->info.vocab_size));
  constexpr int64_t kLength = 12;

  const Rounds on = run_rounds(model, true, seqs, prompts, kLength);
  ASSERT_EQ(on.together.size(), prompts.size());
  ASSERT_EQ(on.alone.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(on.together[i].tokens.size(), static_cast<size_t>(kLength));
    EXPECT_TRUE(bitwise_equal(on.together[i], on.alone[i])) << model << ": prompt " << i << " beside others vs alone";
    EXPECT_TRUE(bitwise_equal(on.alone[i], on.cached[i])) << model << ": prompt " << i << " alone vs over the cache";
  }
  if (model != "glm5_next-dummy") EXPECT_GT(on.cache_hits, 0) << model;

  const Rounds off = run_rounds(model, false, 4, prompts, kLength);
  int64_t differ = 0, rows = 0;
  for (size_t i = 0; i < off.together.size() && i < off.alone.size(); ++i) {
    rows += static_cast<int64_t>(off.alone[i].logprobs.size());
    for (size_t t = 0; t < off.alone[i].logprobs.size() && t < off.together[i].logprobs.size(); ++t)
      differ += std::memcmp(&off.alone[i].logprobs[t], &off.together[i].logprobs[t], sizeof(float)) != 0;
  }
  std::printf("%s: bound %lld rows / %lld chunk rows; batch_invariant on (max_num_seqs %lld), 4 prompts x %lld tokens "
              "bitwise equal together / alone / cached (%lld cached prompt tokens); off, %lld of %lld logprobs differ "
              "between together and alone\n",
              model.c_str(), static_cast<long long>(bound.rows), static_cast<long long>(bound.chunk_rows),
              static_cast<long long>(seqs), static_cast<long long>(kLength), static_cast<long long>(on.cache_hits),
              static_cast<long long>(differ), static_cast<long long>(rows));
}

INSTANTIATE_TEST_SUITE_P(Models, BatchInvariantServing,
                         ::testing::Values("tiny-glm", "glm4_moe_lite-tiny", "glm_moe_dsa-tiny", "glm4_moe_lite-h3-qproj",
                                           "glm5_next-dummy"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace kiln::testing
