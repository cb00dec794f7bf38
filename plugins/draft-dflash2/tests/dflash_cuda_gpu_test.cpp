// The CUDA half of the `dflash` / `dflash2` drafters (plugins/draft-dflash2/cuda) on the trained tiny target:
//   - through the engine on the GPU, greedy output with drafting equals plain GPU decoding token for token, K = 1..7,
//     with the shipped DFlash2 drafter, a random DFlash (v1) checkpoint, and an fp8 draft cache;
//   - the CUDA block forward against the host DflashModel on the same checkpoint, taps and context: logits within
//     kLogitTolerance (max|Δ| / max|host|; the device rounds the linears' inputs and weights to bf16) and greedy
//     drafts equal at ≥ kDraftAgreement of the positions (a near-tie may flip a draft, and the walk then continues
//     from another predecessor), with an fp8 cache within kFp8LogitTolerance;
//   - at T > 0 the drafts follow q: each q row sums to 1, every draft is in its row's support, and first drafts
//     repeated over one context match q by chi-square.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "common/test_model.h"
#include "dflash_config.h"
#include "dflash_cuda_model.h"
#include "dflash_drafter_common.h"
#include "dflash_model.h"
#include "dflash_test_support.h"
#include "dflash_weights.h"
#include "engine/engine_draft_services.h"
#include "engine/engine_factory.h"
#include "engine/speculative_drafter.h"
#include "engine_harness.h"
#include "gpu/glm5_next_gpu_checkpoint.h"
#include "recipe/recipe.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;
using namespace kiln::dflash;

constexpr double kLogitTolerance = 5e-2;     // as the CUDA runner's fixture tests
constexpr double kFp8LogitTolerance = 1e-1;  // an fp8 K/V value one rounding step apart is 6–12 % off
constexpr double kDraftAgreement = 0.6;      // of all draft positions; a flipped draft also moves the walk after it

fs::path random_v1() {
  static const fs::path dir = RandomCheckpoint(false, 2).write("gpu-v1");
  return dir;
}

// Rows per step stay within the runner's batch-invariance bound (32: tests/gpu/cuda_speculative_test.cpp says why):
// ≤ 8 scheduled tokens + 7 drafts × 3 sequences = 29, and prompt chunks of ≤ 8 tokens run the decode path.
Recipe gpu_recipe(const std::string& method, const fs::path& draft, int depth, const std::vector<std::string>& extra = {}) {
  return drafting_recipe({"model.device=cuda", "kv.layout=bf16", "kv.block_size=4", "scheduler.max_model_len=160",
                          "scheduler.max_num_seqs=3", "scheduler.max_num_batched_tokens=8"},
                         method, draft, depth, extra);
}

void expect_same_as_plain(const Recipe& recipe, int depth) {
  LoadedModel m = load(recipe);
  ASSERT_TRUE(m.on_gpu());
  std::mt19937 rng(300 + depth);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(random_prompt(rng, 3 + 9 * i, 4000));
    lengths.push_back(6 + 11 * i);
  }
  // The reference feeds prompts in chunks of 8, as the engine's 8-token steps do: chunks under 16 tokens run the
  // decode path, whose rows do not depend on what shares their step (a whole 30-token prompt would run the prefill
  // kernel instead).
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(greedy_reference(m, prompts[i], lengths[i], 8));
  auto started = start_engine(m, recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  const std::vector<Outcome> outcomes = run_requests(*started->engine, prompts, lengths);
  ASSERT_EQ(outcomes.size(), prompts.size());
  for (size_t i = 0; i < outcomes.size(); ++i)
    EXPECT_EQ(outcomes[i].tokens, expected[i]) << "request " << i << " at depth " << depth;
  const EngineMetrics metrics = wait_idle(*started->engine);
  EXPECT_EQ(metrics.kv_blocks_used, 0);
  EXPECT_GT(metrics.spec_draft_tokens, 0);
  std::printf("GPU K=%d: %lld of %lld drafts accepted\n", depth, static_cast<long long>(metrics.spec_accepted_tokens),
              static_cast<long long>(metrics.spec_draft_tokens));
  started->engine->drain();
}

class CudaGreedyDflash2 : public ::testing::TestWithParam<int> {};
TEST_P(CudaGreedyDflash2, OutputEqualsNoDrafting) {
  expect_same_as_plain(gpu_recipe("dflash2", kDrafter, GetParam()), GetParam());
}
INSTANTIATE_TEST_SUITE_P(Depths, CudaGreedyDflash2, ::testing::Range(1, 8));

class CudaGreedyDflash : public ::testing::TestWithParam<int> {};
TEST_P(CudaGreedyDflash, OutputEqualsNoDrafting) {
  expect_same_as_plain(gpu_recipe("dflash", random_v1(), GetParam()), GetParam());
}
INSTANTIATE_TEST_SUITE_P(Depths, CudaGreedyDflash, ::testing::Range(1, 8));

// DFlash2 for a GLM-5.3-Flash-shaped target on the GPU (a random glm5_next checkpoint at the CUDA runner's shapes:
// KDA and DSA layers, four hyper-connection streams; its taps are the streams' means and the final-normed rows):
// greedy output with a drafter tapping layers 1, 4 and the last equals the same engine without drafting, K = 3 and 5.
TEST(CudaDflash2, DraftsLosslesslyForAHyperConnectedTarget) {
  DraftTarget t;
  t.hidden = glm5_gpu::kHidden, t.vocab = glm5_gpu::kVocab, t.layers = 6, t.taps = {1, 4, 5}, t.mask_token = 511;
  t.heads = 2, t.kv_heads = 1, t.head_dim = 64;  // the CUDA forward takes head_dim in multiples of 64
  load_plugin();
  const fs::path dir = RandomCheckpoint(true, 2, false, t).write("gpu-glm5-next");
  const std::vector<std::string> settings = {
      "model.path=" + glm5_gpu::write_checkpoint(glm5_gpu::kDenseTopK).string(), "model.device=cuda",
      "kv.layout=bf16", "kv.block_size=16", "scheduler.max_model_len=160", "scheduler.max_num_seqs=3",
      "scheduler.max_num_batched_tokens=8"};
  std::mt19937 rng(92);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(rng, 3 + 9 * i, 500)), lengths.push_back(6 + 11 * i);
  auto outputs = [&](const Recipe& recipe, EngineMetrics& metrics) {
    return engine_outputs(recipe, prompts, lengths, metrics);
  };
  auto plain_recipe = load_recipe("", settings, global_registry());
  ASSERT_TRUE(plain_recipe.ok()) << plain_recipe.status().to_string();
  EngineMetrics plain_metrics;
  const auto plain = outputs(*plain_recipe, plain_metrics);
  ASSERT_EQ(plain.size(), prompts.size());
  for (int depth : {3, 5}) {
    std::vector<std::string> drafted = settings;
    drafted.insert(drafted.end(), {"speculative.method=dflash2", "speculative.depth=" + std::to_string(depth),
                                   "speculative.draft_model=" + dir.string()});
    auto recipe = load_recipe("", drafted, global_registry());
    ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
    EngineMetrics metrics;
    EXPECT_EQ(outputs(*recipe, metrics), plain) << "K = " << depth;
    EXPECT_GT(metrics.spec_draft_tokens, 0) << "K = " << depth;
  }
}

TEST(CudaDflash2, Fp8DraftKvStaysLossless) {
  expect_same_as_plain(gpu_recipe("dflash2", kDrafter, 5, {"speculative.draft_kv_dtype=fp8"}), 5);
}

// The host model's view of the target: its embedding and lm_head through the CPU engine's services.
class HostHead final : public TargetHead {
 public:
  explicit HostHead(DraftServices& s) : s_(s) {}
  Status embed(const int32_t* ids, int64_t n, float* out) override {
    return s_.embed(ids, n, TensorView::contiguous(out, DType::kF32, {n, s_.hidden_size()}));
  }
  Status lm_head(const float* hidden, int64_t n, float* logits) override {
    return s_.lm_head(TensorView::contiguous(const_cast<float*>(hidden), DType::kF32, {n, s_.hidden_size()}), logits);
  }

 private:
  DraftServices& s_;
};

double rel_error(const float* got, const float* want, int64_t n) {
  double d = 0, mx = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, double(std::fabs(got[i] - want[i]))), mx = std::max(mx, double(std::fabs(want[i])));
  return mx > 0 ? d / mx : d;
}

// Six sequences drafted in one CUDA forward (K = 7 .. 3; contexts of different lengths in pages of their own)
// against the host model drafting each alone, on the same target taps (the CPU target's, copied to the device).
void compare_forwards(const fs::path& draft, bool v2, KvDtype kv, double tolerance) {
  constexpr int32_t kPagesPerSequence = 16;  // 64 positions of 4
  const std::vector<int64_t> ctx_len = {37, 20, 9, 30, 45, 14};
  const std::vector<int> depth = {7, 7, 6, 5, 4, 3};
  const int32_t pages = kPagesPerSequence * static_cast<int32_t>(ctx_len.size());
  load_plugin();
  LoadedModel cpu = load_recipe_model({"model.path=" + kTarget.string(), "model.device=cpu", "kv.block_size=4"});
  LoadedModel gpu = load_recipe_model({"model.path=" + kTarget.string(), "model.device=cuda", "kv.layout=bf16",
                                       "kv.block_size=4"});
  ASSERT_TRUE(gpu.on_gpu());
  const int64_t H = cpu.info.hidden_size, V = cpu.info.vocab_size, L = cpu.info.num_layers;
  auto config = read_config(draft.string(), v2, H, V, L);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EngineDraftServices cs(*cpu.model, cpu.format, L, draft.string()), gs(*gpu.model, gpu.format, L, draft.string());
  auto source = gs.open_checkpoint(draft.string());
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  auto weights = load_weights(**source, *config, H, draft.string());
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  DflashModel host(*config, *weights, H, kv);
  // The GPU pool: the target's layers and the drafter's.
  CacheSpec spec = gpu.arch->cache_spec(0, gpu.layout->indexer_key_format());
  const int64_t target_layers = static_cast<int64_t>(spec.layers.size());
  for (const LayerCacheSpec& l : dflash_capabilities(*config, host.kv_row_bytes()).cache_layers) spec.layers.push_back(l);
  CacheManagerConfig cfg;
  cfg.num_blocks = pages;
  cfg.block_size = 4;
  cfg.prefix_caching = false;
  cfg.state_slots = 1;
  auto pool = CacheManager::create(spec, gpu.layout.get(), gpu.device.get(), cfg);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  gs.attach(pool->get(), target_layers);
  auto device_model = DflashCudaModel::load(gs, **source, *config, *weights, kv);
  ASSERT_TRUE(device_model.ok()) << device_model.status().to_string();
  DflashCudaModel& dev = **device_model;
  HostHead head(cs);

  // Contexts: the CPU target's taps over random prompts.
  std::mt19937 rng(11);
  std::vector<TensorView> taps_dev;
  std::vector<std::vector<float>> taps_host(config->target_layers.size());
  std::vector<ContextRow> rows;
  std::vector<DraftBlock> blocks;
  std::vector<std::vector<int32_t>> tables(ctx_len.size()), tokens(ctx_len.size());
  int64_t row0 = 0, total = 0;
  for (int64_t n : ctx_len) total += n;
  for (auto& t : taps_host) t.reserve(static_cast<size_t>(total * H));
  for (size_t s = 0; s < ctx_len.size(); ++s) {
    tokens[s] = random_prompt(rng, ctx_len[s] + 1, 4000);
    TestKv kvc(cpu, 64);
    std::vector<int32_t> t;
    ASSERT_TRUE(kvc.reserve(t, 64).ok());
    SequenceStep step{std::span<const int32_t>(tokens[s].data(), ctx_len[s]), 0, &t, false};
    StepOptions options;
    options.tap_layers = config->target_layers;
    StepOutput o;
    ASSERT_TRUE(cpu.model->step({&step, 1}, {}, kvc.views(), options, o).ok());
    for (size_t k = 0; k < taps_host.size(); ++k)
      taps_host[k].insert(taps_host[k].end(), o.taps[k].as<const float>(), o.taps[k].as<const float>() + ctx_len[s] * H);
    for (int32_t b = 0; b < kPagesPerSequence; ++b)
      tables[s].push_back(static_cast<int32_t>(s) * kPagesPerSequence + b);
    for (int64_t i = 0; i < ctx_len[s]; ++i)
      rows.push_back({static_cast<int32_t>(row0 + i), i, static_cast<int64_t>(tables[s][i / 4]) * 4 + i % 4});
    DraftBlock blk;
    blk.anchor = tokens[s][ctx_len[s]];
    blk.anchor_position = ctx_len[s];
    blk.depth = depth[s];
    blk.block_table = tables[s].data();
    blk.num_blocks = kPagesPerSequence;
    blocks.push_back(blk);
    row0 += ctx_len[s];
  }
  for (auto& t : taps_host) {
    auto p = gpu.device->allocate(t.size() * 4, "test taps");
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(gpu.device->copy(*p, t.data(), t.size() * 4, true).ok());
    taps_dev.push_back(TensorView::contiguous(*p, DType::kF32, {total, H}, gpu.device->device()));
  }
  ASSERT_TRUE(dev.run(taps_dev, rows, blocks).ok());
  std::vector<float> logits(static_cast<size_t>(dev.draft_rows() * V));
  std::vector<int32_t> drafts(static_cast<size_t>(dev.draft_rows()));
  ASSERT_TRUE(gpu.device->copy(logits.data(), dev.logits(), logits.size() * 4, false).ok());
  ASSERT_TRUE(gpu.device->copy(drafts.data(), dev.tokens(), drafts.size() * 4, true).ok());
  for (float& x : logits) {  // the host model's logits come after these (1.0 and none for both checkpoints here)
    x *= static_cast<float>(config->output_multiplier);
    if (config->softcap > 0) x = static_cast<float>(std::tanh(x / config->softcap) * config->softcap);
  }

  int equal = 0, positions = 0;
  row0 = 0;
  for (size_t s = 0; s < ctx_len.size(); ++s) {
    const size_t row_bytes = host.kv_row_bytes();
    std::vector<std::vector<uint8_t>> k(config->layers, std::vector<uint8_t>(pages * 4 * row_bytes)),
        v(config->layers, std::vector<uint8_t>(pages * 4 * row_bytes));
    SequenceCache cache;
    for (int64_t l = 0; l < config->layers; ++l) cache.k.push_back(k[l].data()), cache.v.push_back(v[l].data());
    cache.block_table = tables[s].data();
    cache.num_blocks = kPagesPerSequence;
    cache.block_size = 4;
    std::vector<const float*> taps;
    for (auto& t : taps_host) taps.push_back(t.data() + row0 * H);
    ASSERT_TRUE(host.append_context(taps, H, ctx_len[s], 0, cache).ok());
    std::mt19937_64 unused(1);
    BlockDrafts out;
    ASSERT_TRUE(host.draft(blocks[s].anchor, ctx_len[s], depth[s], 0.0f, unused, cache, head, out).ok());
    const int64_t first = dev.first_row(s);
    const double err = rel_error(logits.data() + first * V, host.logits().data(), depth[s] * V);
    EXPECT_LE(err, tolerance) << "sequence " << s;
    for (int t = 0; t < depth[s]; ++t) equal += drafts[first + t] == out.tokens[t], ++positions;
    std::printf("sequence %zu: logits within %.2e of the host's; drafts", s, err);
    for (int t = 0; t < depth[s]; ++t) std::printf(" %d/%d", drafts[first + t], out.tokens[t]);
    std::printf("\n");
    row0 += ctx_len[s];
  }
  EXPECT_GE(equal, kDraftAgreement * positions) << equal << " of " << positions << " greedy drafts agree";
}

TEST(CudaDflashForward, Dflash2MatchesTheHostModel) { compare_forwards(kDrafter, true, KvDtype::kBf16, kLogitTolerance); }
TEST(CudaDflashForward, Dflash2WithFp8CacheMatchesTheHostModel) {
  compare_forwards(kDrafter, true, KvDtype::kFp8, kFp8LogitTolerance);
}
// The random checkpoint's window of 6 positions exercises the windowed context.
TEST(CudaDflashForward, DflashMatchesTheHostModel) { compare_forwards(random_v1(), false, KvDtype::kBf16, kLogitTolerance); }

// T > 0 through the plugin on the GPU: q rows on the device sum to 1, drafts lie in q's support, and the first
// drafts of one context proposed again and again follow q (chi-square).
TEST(CudaDflash2, SampledDraftsFollowTheirQ) {
  const Recipe recipe = gpu_recipe("dflash2", kDrafter, 3);
  LoadedModel m = load(recipe);
  ASSERT_TRUE(m.on_gpu());
  EngineDraftServices services(*m.model, m.format, m.info.num_layers, kDrafter.string());
  auto drafter = create_drafter(recipe, global_registry(), m.info, *m.device, &services);
  ASSERT_TRUE(drafter.ok()) << drafter.status().to_string();
  CacheSpec spec = m.arch->cache_spec(0, m.layout->indexer_key_format());
  const int64_t target_layers = static_cast<int64_t>(spec.layers.size());
  for (const LayerCacheSpec& l : (*drafter)->capabilities().cache_layers) spec.layers.push_back(l);
  CacheManagerConfig cfg;
  cfg.num_blocks = 16;
  cfg.block_size = 4;
  cfg.prefix_caching = false;
  cfg.state_slots = 1;
  auto pool = CacheManager::create(spec, m.layout.get(), m.device.get(), cfg);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  services.attach(pool->get(), target_layers);
  std::vector<int32_t> table;
  for (int32_t b = 0; b < 16; ++b) table.push_back(b);
  const std::vector<int32_t> prompt = {100, 200, 300, 400, 500, 600}, next = {200, 300, 400, 500, 600, 700};
  SequenceStep step{std::span<const int32_t>(prompt.data(), prompt.size()), 0, &table, false};
  StepOptions options;
  options.tap_layers = (*drafter)->capabilities().tap_layers;
  StepOutput o;
  ASSERT_TRUE(m.model->step({&step, 1}, {}, (*pool)->views(), options, o).ok());
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
  s.num_blocks = 16;
  ds.seqs = {s};
  std::map<int32_t, int64_t> counts;
  std::vector<int32_t> q_ids;
  std::vector<float> q;
  constexpr int64_t kDraws = 2000;
  for (int64_t i = 0; i < kDraws; ++i) {
    std::vector<DraftProposal> out;
    ASSERT_TRUE((*drafter)->propose(ds, out).ok());
    ASSERT_EQ(out[0].tokens.size(), 3u);
    ASSERT_GT(out[0].q_width, 0);
    const int64_t w = out[0].q_width;
    std::vector<int32_t> ids(3 * w);
    std::vector<float> probs(3 * w);
    ASSERT_TRUE(m.device->copy(ids.data(), out[0].q_ids, ids.size() * 4, false).ok());
    ASSERT_TRUE(m.device->copy(probs.data(), out[0].q_probs, probs.size() * 4, true).ok());
    for (int t = 0; t < 3; ++t) {
      double sum = 0;
      bool in_support = false;
      for (int64_t j = 0; j < w; ++j) {
        sum += probs[t * w + j];
        in_support |= ids[t * w + j] == out[0].tokens[t] && probs[t * w + j] > 0;
      }
      ASSERT_NEAR(sum, 1.0, 1e-4) << "draft " << t;
      ASSERT_TRUE(in_support) << "draft " << t << " = " << out[0].tokens[t] << " is outside its q";
    }
    if (i == 0) {
      q_ids.assign(ids.begin(), ids.begin() + w);
      q.assign(probs.begin(), probs.begin() + w);
    } else {
      ASSERT_TRUE(std::equal(q_ids.begin(), q_ids.end(), ids.begin()));  // the same context gives the same q
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
  EXPECT_LT(chi, 45.0) << "over " << cells << " cells";  // df ≤ 15: the 1e-4 tail ≈ 44
  std::printf("GPU first drafts against q: chi-square %.1f over %d cells\n", chi, cells);
}

}  // namespace
}  // namespace kiln::testing
