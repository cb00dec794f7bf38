// The `dflash` / `dflash2` drafters (plugins/draft-dflash2) on the CPU against the trained tiny target
// (models/tiny-glm):
//   - greedy output through the batching engine equals plain greedy generation, token for token, for K = 1..7 with
//     the shipped DFlash2 drafter (models/tiny-glm-dflash2) and with a random DFlash (v1) checkpoint, and with an
//     fp8 draft KV cache;
//   - at T > 0 the drafts are distributed as the q returned with them (chi-square over repeated proposals), and the
//     engine's rejection sampling with that q leaves the target's distribution of sampled tokens unchanged
//     (chi-square against the target's exact probabilities);
//   - the engine accepts exactly what fresh proposals at the same anchors predict (the drafter's incrementally grown
//     context is the one-prefill context);
//   - malformed or mismatched checkpoints are refused with a message naming the file and the tensor or key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>


#include "common/reference_fixture.h"
#include "dflash_test_support.h"
#include "common/test_model.h"
#include "engine/engine_draft_services.h"
#include "engine/engine_factory.h"
#include "engine/memory_model.h"
#include "engine/speculative_drafter.h"
#include "engine_harness.h"
#include "kernels/cpu/sampling.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path random_v1() {
  static const fs::path dir = RandomCheckpoint(false, 2).write("v1");
  return dir;
}

Recipe recipe_for(const std::string& method, const fs::path& draft, int depth, const std::vector<std::string>& extra = {}) {
  return drafting_recipe({"kv.layout=fp32", "kv.block_size=4", "scheduler.max_model_len=160", "scheduler.max_num_seqs=4",
                          "scheduler.max_num_batched_tokens=32"},
                         method, draft, depth, extra);
}

// Concurrent requests through the engine against plain greedy generation; returns the engine's metrics.
EngineMetrics expect_same_as_plain(const Recipe& recipe, int depth) {
  LoadedModel m = load(recipe);
  std::mt19937 rng(300 + depth);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(random_prompt(rng, 3 + 9 * i, 4000));
    lengths.push_back(6 + 11 * i);  // 6 .. 39 tokens: budgets shorter than K, and many passes
  }
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(greedy_reference(m, prompts[i], lengths[i]));
  auto started = start_engine(m, recipe);
  EXPECT_TRUE(started.ok()) << started.status().to_string();
  if (!started.ok()) return {};
  const std::vector<Outcome> outcomes = run_requests(*started->engine, prompts, lengths);
  EXPECT_EQ(outcomes.size(), prompts.size());
  for (size_t i = 0; i < outcomes.size(); ++i)
    EXPECT_EQ(outcomes[i].tokens, expected[i]) << "request " << i << " at depth " << depth;
  EngineMetrics metrics = wait_idle(*started->engine);
  EXPECT_EQ(metrics.kv_blocks_used, 0);
  EXPECT_GT(metrics.spec_draft_tokens, 0);
  std::printf("K=%d: %lld of %lld drafts accepted\n", depth, static_cast<long long>(metrics.spec_accepted_tokens),
              static_cast<long long>(metrics.spec_draft_tokens));
  return metrics;
}

class GreedyDflash2 : public ::testing::TestWithParam<int> {};
TEST_P(GreedyDflash2, OutputEqualsNoDrafting) {
  const int depth = GetParam();
  expect_same_as_plain(recipe_for("dflash2", kDrafter, depth), depth);
}
INSTANTIATE_TEST_SUITE_P(Depths, GreedyDflash2, ::testing::Range(1, 8));

class GreedyDflash : public ::testing::TestWithParam<int> {};
TEST_P(GreedyDflash, OutputEqualsNoDrafting) {
  const int depth = GetParam();
  expect_same_as_plain(recipe_for("dflash", random_v1(), depth), depth);
}
INSTANTIATE_TEST_SUITE_P(Depths, GreedyDflash, ::testing::Range(1, 8));

TEST(Dflash2, Fp8DraftKvStaysLossless) {
  expect_same_as_plain(recipe_for("dflash2", kDrafter, 5, {"speculative.draft_kv_dtype=fp8"}), 5);
}

TEST(Dflash2, ModelPrefixedKeysLoadLikeBareOnes) {
  static const fs::path dir = RandomCheckpoint(true, 1, true).write("v2-prefixed");
  expect_same_as_plain(recipe_for("dflash2", dir, 3), 3);
}

// A drafter over the engine's services with a pool of the target's layers and the drafter's own.
struct Fixture {
  Recipe recipe;
  LoadedModel m;
  std::unique_ptr<EngineDraftServices> services;
  Result<std::shared_ptr<Drafter>> drafter = failed_precondition("not made");

  Fixture(const std::string& method, const fs::path& draft, int depth = 3, const std::vector<std::string>& extra = {})
      : recipe(recipe_for(method, draft, depth, extra)), m(load(recipe)) {
    services = std::make_unique<EngineDraftServices>(*m.model, m.format, m.info.num_layers, draft.string());
    drafter = create_drafter(recipe, global_registry(), m.info, *m.device, services.get());
  }
};

std::string refusal(const fs::path& dir, const std::string& method = "dflash2") {
  Fixture f(method, dir);
  EXPECT_FALSE(f.drafter.ok());
  return f.drafter.ok() ? "" : f.drafter.status().message();
}

TEST(DflashCheckpoint, MissingTensorIsNamedWithTheFile) {
  RandomCheckpoint c(true);
  c.tensors.erase("layers.0.mlp_conv.kernel_projection.weight");
  const fs::path dir = c.write("missing");
  const std::string m = refusal(dir);
  EXPECT_NE(m.find((dir / "model.safetensors").string()), std::string::npos) << m;
  EXPECT_NE(m.find("`layers.0.mlp_conv.kernel_projection.weight`"), std::string::npos) << m;
}

TEST(DflashCheckpoint, WrongShapeIsNamedWithBothShapes) {
  RandomCheckpoint c(true);
  c.tensors["layers.0.self_attn.k_proj.weight"] = {{64, 256}, std::vector<float>(64 * 256, 0.0f)};
  const fs::path dir = c.write("shape");
  const std::string m = refusal(dir);
  EXPECT_NE(m.find((dir / "model.safetensors").string()), std::string::npos) << m;
  EXPECT_NE(m.find("`layers.0.self_attn.k_proj.weight` has shape [64, 256], config.json implies [128, 256]"),
            std::string::npos) << m;
}

TEST(DflashCheckpoint, TargetMismatchIsNamedWithTheConfig) {
  RandomCheckpoint c(true);
  c.config["hidden_size"] = 128;
  const fs::path dir = c.write("hidden");
  const std::string m = refusal(dir);
  EXPECT_NE(m.find((dir / "config.json").string() + ": hidden_size 128 differs from the target's 256"), std::string::npos)
      << m;
  RandomCheckpoint t(true);
  t.config["dflash_config"]["target_layer_ids"] = {1, 6};
  EXPECT_NE(refusal(t.write("taps")).find("target_layer_ids holds 6, not a layer of the target (0..5)"), std::string::npos);
}

// HF's hidden_states[L] — what the references tap for the last layer — is the output after the final norm, not the
// residual: a drafter tapping the last layer asks the target for kTapFinalNormed.
TEST(Dflash2, TappingTheLastLayerAsksForTheFinalNormedOutput) {
  RandomCheckpoint c(true);
  c.config["dflash_config"]["target_layer_ids"] = {1, 5};
  const fs::path dir = c.write("last-tap");
  {
    Fixture f("dflash2", dir);
    ASSERT_TRUE(f.drafter.ok()) << f.drafter.status().to_string();
    EXPECT_EQ((*f.drafter)->capabilities().tap_layers, (std::vector<int>{1, kTapFinalNormed}));
  }
  expect_same_as_plain(recipe_for("dflash2", dir, 3), 3);  // the engine hands that tap through verification
}

// DFlash2 for a GLM-5.3-Flash-shaped target (glm5_next: KDA and DSA layers, four hyper-connection streams; the
// transformers fixture glm5_next-tiny): a drafter tapping two inner layers (each the mean of its streams) and the
// last (its final-normed output) asks for those taps and drafts losslessly through the engine at K = 3 and 5.
TEST(Dflash2, DraftsLosslesslyForAHyperConnectedTarget) {
  DraftTarget t;
  t.hidden = 32, t.vocab = 512, t.layers = 8, t.taps = {1, 4, 7}, t.mask_token = 511;
  t.heads = 2, t.kv_heads = 1, t.head_dim = 16;
  const fs::path dir = RandomCheckpoint(true, 2, false, t).write("glm5-next");
  const std::string target = "model.path=" + (fs::path(KILN_SOURCE_DIR) / "tests/data/models/glm5_next-tiny").string();
  {
    Fixture f("dflash2", dir, 3, {target});
    ASSERT_TRUE(f.drafter.ok()) << f.drafter.status().to_string();
    EXPECT_EQ((*f.drafter)->capabilities().tap_layers, (std::vector<int>{1, 4, kTapFinalNormed}));
  }
  // The reference: the same engine without drafting (greedy_reference steps without the state slot KDA needs).
  std::mt19937 rng(91);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(rng, 3 + 9 * i, 500)), lengths.push_back(6 + 11 * i);
  auto outputs = [&](const Recipe& recipe, EngineMetrics& metrics) {
    return engine_outputs(recipe, prompts, lengths, metrics);
  };
  EngineMetrics plain_metrics;
  auto plain_recipe = load_recipe("", {target, "kv.layout=fp32", "kv.block_size=4", "scheduler.max_model_len=160",
                                        "scheduler.max_num_seqs=4", "scheduler.max_num_batched_tokens=32"},
                                  global_registry());
  ASSERT_TRUE(plain_recipe.ok()) << plain_recipe.status().to_string();
  const auto plain = outputs(*plain_recipe, plain_metrics);
  ASSERT_EQ(plain.size(), prompts.size());
  for (size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(plain[i].size(), static_cast<size_t>(lengths[i]));
  for (int depth : {3, 5}) {
    EngineMetrics metrics;
    EXPECT_EQ(outputs(recipe_for("dflash2", dir, depth, {target}), metrics), plain) << "K = " << depth;
    EXPECT_GT(metrics.spec_draft_tokens, 0) << "K = " << depth;
  }
}

// A corrupt config (keys of the wrong JSON type) is refused with the key named, never thrown; null is "absent".
TEST(DflashCheckpoint, KeysOfTheWrongTypeAreNamed) {
  RandomCheckpoint act(true);
  act.config["hidden_act"] = 5;
  EXPECT_NE(refusal(act.write("act-type")).find("`hidden_act` must be a string, got 5"), std::string::npos);
  RandomCheckpoint tie(true);
  tie.config["tie_word_embeddings"] = "no";
  EXPECT_NE(refusal(tie.write("tie-type")).find("`tie_word_embeddings` must be a boolean"), std::string::npos);
  RandomCheckpoint layers(true);
  layers.config["num_hidden_layers"] = "1";
  EXPECT_NE(refusal(layers.write("layers-type")).find("needs an integer `num_hidden_layers`"), std::string::npos);
  RandomCheckpoint nulls(true);
  nulls.config["use_sliding_window"] = nullptr;
  nulls.config["hidden_act"] = nullptr;
  Fixture f("dflash2", nulls.write("nulls"));
  EXPECT_TRUE(f.drafter.ok()) << f.drafter.status().to_string();
}

// `kiln recipe show` / the memory screen read the drafter's config before the drafter does: a corrupt one is priced
// as "unknown", not thrown (the drafter's loader then names what is wrong).
TEST(DflashCheckpoint, TheMemoryModelReadsACorruptConfigWithoutThrowing) {
  RandomCheckpoint c(true);
  c.config["num_hidden_layers"] = "2";
  c.config["num_key_value_heads"] = -4;
  c.config["head_dim"] = 1e30;
  c.config["dflash_config"]["target_layer_ids"] = "1,3";
  const Recipe recipe = recipe_for("dflash2", c.write("memory-corrupt"), 3);
  const auto in = memory_inputs(recipe, global_registry());
  EXPECT_TRUE(in.ok()) << in.status().to_string();
}

TEST(DflashCheckpoint, ArchitectureMustMatchTheDrafter) {
  const std::string m = refusal(kDrafter, "dflash");
  EXPECT_NE(m.find("this is a DFlash2DraftModel checkpoint: select `dflash2`"), std::string::npos) << m;
  const std::string missing = refusal(fs::temp_directory_path() / "kiln-no-such-drafter");
  EXPECT_NE(missing.find("config.json: cannot be read"), std::string::npos) << missing;
}

TEST(Dflash2, DepthBeyondTheBlockIsRefusedAtLoad) {
  const Recipe recipe = recipe_for("dflash2", kDrafter, 8);
  LoadedModel m = load(recipe);
  auto started = start_engine(m, recipe);
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.status().message().find("beyond the drafter's maximum of 7"), std::string::npos)
      << started.status().to_string();
}

TEST(Dflash2, AdvertisesItsCheckpointsShape) {
  Fixture f("dflash2", kDrafter);
  ASSERT_TRUE(f.drafter.ok()) << f.drafter.status().to_string();
  const DrafterCapabilities caps = (*f.drafter)->capabilities();
  EXPECT_EQ(caps.tap_layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(caps.max_depth, 7);
  EXPECT_TRUE(caps.parallel_drafting);
  EXPECT_TRUE(caps.has_draft_probs);
  EXPECT_TRUE(caps.needs_draft_model);
  ASSERT_EQ(caps.cache_layers.size(), 2u);
  EXPECT_EQ(caps.cache_layers[0].entries[0].row_bytes, 2u * 2 * 64);  // 2 KV heads × 64, bf16
}

// A pool of the target's layers and the drafter's own (as the engine makes it), attached to the fixture's services;
// one sequence's block table covering all of it.
struct DraftPool {
  std::unique_ptr<CacheManager> caches;
  std::vector<int32_t> table;
  bool ok = false;

  explicit DraftPool(Fixture& f, int64_t blocks = 16) {
    if (!f.drafter.ok()) return;
    CacheSpec spec = f.m.arch->cache_spec(0, f.m.layout->indexer_key_format());
    const int64_t target_layers = static_cast<int64_t>(spec.layers.size());
    for (const LayerCacheSpec& l : (*f.drafter)->capabilities().cache_layers) spec.layers.push_back(l);
    CacheManagerConfig cfg;
    cfg.num_blocks = blocks;
    cfg.block_size = f.m.layout->geometry().block_size;
    cfg.prefix_caching = false;
    cfg.state_slots = 1;
    auto made = CacheManager::create(spec, f.m.layout.get(), f.m.device.get(), cfg);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    if (!made.ok()) return;
    caches = std::move(made).value();
    f.services->attach(caches.get(), target_layers);
    for (int32_t b = 0; b < blocks; ++b) table.push_back(b);
    ok = true;
  }
};

// The drafter's proposal at anchor position a of `tokens` (tokens[a] the anchor) with its context built in one
// prefill of tokens[0, a) on a fresh pool, as the first proposal after a prompt is.
std::vector<int32_t> fresh_proposal(Fixture& f, const std::vector<int32_t>& tokens, int64_t a, int depth) {
  DraftPool pool(f, 64);
  EXPECT_TRUE(pool.ok);
  if (!pool.ok) return {};
  SequenceStep step{std::span<const int32_t>(tokens.data(), a), 0, &pool.table, false};
  StepOptions options;
  options.tap_layers = (*f.drafter)->capabilities().tap_layers;
  StepOutput o;
  const Status stepped = f.m.model->step({&step, 1}, {}, pool.caches->views(), options, o);
  EXPECT_TRUE(stepped.ok()) << stepped.to_string();
  if (!stepped.ok()) return {};
  DraftStep ds;
  ds.taps = o.taps;
  DraftSequence s;
  s.seq_id = 1, s.num_rows = a, s.next_tokens = tokens.data() + 1, s.depth = depth;
  s.block_table = pool.table.data(), s.num_blocks = static_cast<int64_t>(pool.table.size());
  ds.seqs = {s};
  std::vector<DraftProposal> out;
  const Status proposed = (*f.drafter)->propose(ds, out);
  EXPECT_TRUE(proposed.ok()) << proposed.to_string();
  (*f.drafter)->release(1);
  return proposed.ok() && !out.empty() ? out[0].tokens : std::vector<int32_t>{};
}

// Greedy drafts equal those of the training script's forward (tools/train_dflash.py --reference, on the shipped
// drafter's values): the conventions (taps, RoPE, convs, the selector walk) are the trainer's.
TEST(Dflash2, GreedyDraftsMatchTheTrainersForward) {
  std::ifstream in(fs::path(KILN_SOURCE_DIR) / "plugins/draft-dflash2/tests/data/reference_drafts.json");
  ASSERT_TRUE(in.good());
  const json ref = json::parse(in);
  Fixture f("dflash2", kDrafter, 7);
  ASSERT_TRUE(f.drafter.ok()) << f.drafter.status().to_string();
  int matched = 0, total = 0;
  for (const json& c : ref["cases"]) {
    const std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
    const int64_t a = c["anchor_position"].get<int64_t>();
    ASSERT_EQ(static_cast<int64_t>(tokens.size()), a + 1);
    std::vector<int32_t> drafts;
    ASSERT_NO_FATAL_FAILURE(drafts = fresh_proposal(f, tokens, a, 7));
    const std::vector<int32_t> want = c["drafts"].get<std::vector<int32_t>>();
    EXPECT_EQ(drafts, want) << "anchor at " << a;
    matched += drafts == want;
    ++total;
  }
  std::printf("%d of %d reference blocks drafted identically\n", matched, total);
}

// Drafts at T > 0 are draws from the q returned with them: the same context proposed again and again (the rows
// are rewritten, the sequence's generator advances) gives first drafts whose counts match q by chi-square.
TEST(Dflash2, SampledDraftsFollowTheirQ) {
  Fixture f("dflash2", kDrafter, 3);
  ASSERT_TRUE(f.drafter.ok()) << f.drafter.status().to_string();
  DraftPool pool(f);
  ASSERT_TRUE(pool.ok);
  std::vector<int32_t>& table = pool.table;
  // The target's taps for a short prompt.
  const std::vector<int32_t> prompt = {100, 200, 300, 400, 500, 600};
  SequenceStep step{std::span<const int32_t>(prompt.data(), prompt.size()), 0, &table, false};
  StepOptions options;
  options.want_logits = true;
  options.tap_layers = (*f.drafter)->capabilities().tap_layers;
  StepOutput o;
  ASSERT_TRUE(f.m.model->step({&step, 1}, {}, pool.caches->views(), options, o).ok());
  const std::vector<int32_t> next = {200, 300, 400, 500, 600, 700};
  DraftStep ds;
  ds.taps = o.taps;
  DraftSequence s;
  s.seq_id = 1;
  s.num_rows = 6;
  s.next_tokens = next.data();
  s.depth = 3;
  s.temperature = 1.0f;
  s.seed = 5;
  s.block_table = table.data();
  s.num_blocks = static_cast<int64_t>(table.size());
  ds.seqs = {s};
  std::map<int32_t, int64_t> counts;
  std::vector<int32_t> q_ids;
  std::vector<float> q;
  constexpr int64_t kDraws = 4000;
  for (int64_t i = 0; i < kDraws; ++i) {
    std::vector<DraftProposal> out;
    ASSERT_TRUE((*f.drafter)->propose(ds, out).ok());
    ASSERT_EQ(out[0].tokens.size(), 3u);
    ASSERT_GT(out[0].q_width, 0);
    if (i == 0) {
      q_ids.assign(out[0].q_ids, out[0].q_ids + out[0].q_width);
      q.assign(out[0].q_probs, out[0].q_probs + out[0].q_width);
      double sum = 0;
      for (float p : q) sum += p;
      EXPECT_NEAR(sum, 1.0, 1e-4);
    } else {
      ASSERT_TRUE(std::equal(q_ids.begin(), q_ids.end(), out[0].q_ids));  // the same context gives the same q
    }
    ++counts[out[0].tokens[0]];
  }
  double chi = 0;
  int cells = 0;
  for (size_t j = 0; j < q.size(); ++j) {
    const double e = q[j] * kDraws;
    if (e < 5) continue;
    chi += (counts[q_ids[j]] - e) * (counts[q_ids[j]] - e) / e;
    ++cells;
  }
  EXPECT_GT(cells, 1);
  EXPECT_LT(chi, 45.0) << "over " << cells << " cells";  // df ≤ 15: 1e-4 tail ≈ 44
  std::printf("first drafts against q: chi-square %.1f over %d cells\n", chi, cells);
}

// Rejection sampling with DFlash2's q leaves the target's distribution unchanged: the first two sampled tokens of
// many requests (the second verified against a draft from q) against the target's exact joint probabilities.
TEST(Dflash2, RejectionSamplingPreservesTheTargetDistribution) {
  constexpr float kT = 1.0f;
  constexpr int64_t kRequests = 1500;
  const Recipe recipe = recipe_for("dflash2", kDrafter, 3, {"scheduler.max_num_seqs=16", "scheduler.prefix_caching=false"});
  LoadedModel m = load(recipe);
  const std::vector<int32_t> prompt = {1437, 309, 3264, 14};
  const int64_t V = m.info.vocab_size;
  // Exact p(t1) and p(t2 | t1) at temperature kT for the likely t1.
  auto dist = [&](const std::vector<int32_t>& ids) {
    TestKv kv(m, 64);
    std::vector<int32_t> table;
    EXPECT_TRUE(kv.reserve(table, 64).ok());
    SequenceStep step{std::span<const int32_t>(ids.data(), ids.size()), 0, &table, false};
    StepOptions options;
    options.want_logits = true;
    StepOutput o;
    EXPECT_TRUE(m.model->step({&step, 1}, {}, kv.views(), options, o).ok());
    std::vector<float> logits(o.logits.end() - V, o.logits.end()), p(V);
    cpu::SamplingParams sp;
    sp.temperature = kT;
    cpu::sampling_distribution(logits.data(), V, sp, p.data());
    return p;
  };
  const std::vector<float> p1 = dist(prompt);
  std::map<std::pair<int32_t, int32_t>, double> joint;
  for (int32_t a = 0; a < V; ++a) {
    if (p1[a] * kRequests < 2) continue;
    auto h = prompt;
    h.push_back(a);
    const std::vector<float> p2 = dist(h);
    for (int32_t b = 0; b < V; ++b) joint[{a, b}] = double(p1[a]) * p2[b];
  }
  auto started = start_engine(m, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::map<std::pair<int32_t, int32_t>, int64_t> counts;
  for (int64_t base = 0; base < kRequests; base += 250) {
    Collector c;
    for (int64_t i = 0; i < 250; ++i) {
      RequestParams p;
      p.prompt = prompt;
      p.max_tokens = 3;  // t2 is verified against a draft whenever one is proposed
      p.sampling.temperature = kT;
      p.sampling.seed = static_cast<uint64_t>(base + i + 1) * 7919;
      ASSERT_TRUE(started->engine->submit(p, c.sink(static_cast<int>(i))).ok());
    }
    for (int64_t i = 0; i < 250; ++i) {
      ASSERT_TRUE(c.wait(static_cast<int>(i)));
      const auto t = c.get(static_cast<int>(i)).tokens;
      ASSERT_EQ(t.size(), 3u);
      ++counts[{t[0], t[1]}];
    }
  }
  const EngineMetrics metrics = wait_idle(*started->engine);
  EXPECT_GT(metrics.spec_draft_tokens, 0);
  // Cells with an expected count ≥ 5, the rest pooled into one.
  double chi = 0, rest_p = 1.0;
  int64_t rest_n = kRequests;
  int cells = 0;
  for (const auto& [key, p] : joint) {
    const double e = p * kRequests;
    if (e < 5) continue;
    const int64_t n = counts.count(key) ? counts[key] : 0;
    chi += (n - e) * (n - e) / e;
    rest_p -= p;
    rest_n -= n;
    ++cells;
  }
  const double e = rest_p * kRequests;
  chi += (rest_n - e) * (rest_n - e) / e;
  EXPECT_GT(cells, 3);
  // df = cells; the 1e-4 tail of chi-square(df) is below df + 4.3·sqrt(2·df) + 12 for df ≤ 60.
  EXPECT_LT(chi, cells + 4.3 * std::sqrt(2.0 * cells) + 12) << "over " << cells << " + 1 cells";
  std::printf("sampled (t1, t2) with DFlash2 drafts: chi-square %.1f over %d + 1 cells; %lld of %lld drafts accepted\n",
              chi, cells, static_cast<long long>(metrics.spec_accepted_tokens),
              static_cast<long long>(metrics.spec_draft_tokens));
}

// The drafter's own context rows grow step by step in serving (accepted rows appended, rejected ones dropped); a
// row misplaced there costs acceptance but not losslessness, so the greedy tests cannot see it. Here the engine's
// accepted count over one greedy request equals what fresh proposals predict: each anchor of the greedy
// continuation replayed with the drafter's context built in one prefill, the next anchor after the accepted drafts
// and the bonus token, exactly as the engine walks. (Its acceptance on this text is low — about 0.3 drafts a block,
// as the trainer's own forward drafts the reference anchors in data/reference_drafts.json — but not zero.)
TEST(Dflash2, EngineAcceptsWhatFreshProposalsPredict) {
  constexpr int kDepth = 7;
  Fixture f("dflash2", kDrafter, kDepth);
  ASSERT_TRUE(f.drafter.ok()) << f.drafter.status().to_string();
  const std::vector<int32_t> prompt = {1437, 309, 3264, 14, 880, 37};
  const int64_t gen = 48;
  const std::vector<int32_t> cont = greedy_reference(f.m, prompt, gen);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), cont.begin(), cont.end());
  int64_t a = static_cast<int64_t>(prompt.size()), predicted = 0, proposals = 0;
  std::string walk;
  // Drafts past the generation budget are cut by the engine: replay only whole blocks inside it.
  while (a + kDepth < static_cast<int64_t>(full.size())) {
    const std::vector<int32_t> drafts = fresh_proposal(f, full, a, kDepth);
    ASSERT_EQ(static_cast<int>(drafts.size()), kDepth);
    int n = 0;
    while (n < kDepth && drafts[n] == full[a + 1 + n]) ++n;
    predicted += n, ++proposals;
    walk += std::to_string(n) + " ";
    a += n + 1;
  }
  const int64_t tail = static_cast<int64_t>(full.size()) - a;  // tokens the replay left to the engine's last steps
  auto started = start_engine(f.m, f.recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  const std::vector<Outcome> outcomes = run_requests(*started->engine, {prompt}, {gen});
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].tokens, cont);
  const EngineMetrics metrics = wait_idle(*started->engine);
  std::printf("fresh proposals: %lld accepted over %lld blocks (%s); engine: %lld accepted of %lld drafted\n",
              static_cast<long long>(predicted), static_cast<long long>(proposals), walk.c_str(),
              static_cast<long long>(metrics.spec_accepted_tokens), static_cast<long long>(metrics.spec_draft_tokens));
  EXPECT_GT(predicted, 0) << "a replay that accepts nothing cannot tell a misplaced row";
  EXPECT_GE(metrics.spec_accepted_tokens, predicted);
  EXPECT_LE(metrics.spec_accepted_tokens, predicted + tail);
}

}  // namespace
}  // namespace kiln::testing
