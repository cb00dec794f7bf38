// `fp8_ds_mla` through the SDK and whole models on the CPU: the built plugin registers the layout; attention over
// its pages equals exact attention over the rows they dequantize to; models of every MLA architecture (GLM-4.7-
// Flash, DeepSeek-V3, GLM-5 with DSA, GLM-5.3-Flash's NoPE DSA) run on it with their logit drift and greedy
// agreement against the `bf16` layout measured; and the engine's output through it does not depend on chunking,
// prefix caching or MTP drafting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "engine/single_request.h"
#include "fp8_mla_row.h"
#include "fp8_test_plugins.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "tokenizer/tokenizer.h"

namespace kiln::fp8mla {
namespace {
namespace fs = std::filesystem;


fs::path model_path(const std::string& name) {
  return name == "tiny-glm" ? fs::path(KILN_SOURCE_DIR) / "models/tiny-glm" : kiln::testing::model_dir(name);
}

std::vector<std::string> sets(const std::string& model, const std::string& layout,
                              std::vector<std::string> extra = {}) {
  std::vector<std::string> s = {"model.path=" + model_path(model).string(), "model.device=cpu",
                                "kv.layout=" + layout, "kv.block_size=16", "scheduler.max_model_len=200",
                                "scheduler.max_num_seqs=2"};
  s.insert(s.end(), extra.begin(), extra.end());
  return s;
}

std::vector<int32_t> random_prompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = id(rng);
  return p;
}

// Every prompt row's logits in one step.
std::vector<float> prompt_logits(LoadedModel& m, const std::vector<int32_t>& prompt) {
  kiln::testing::TestKv kv(m, static_cast<int64_t>(prompt.size()));
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.reserve(table, static_cast<int64_t>(prompt.size())).ok());
  SequenceStep step{prompt, 0, &table, true, 0};
  StepOutput out;
  StepOptions options;
  options.want_logits = true;
  const Status s = m.model->step({&step, 1}, {}, kv.views(), options, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out.logits;
}

TEST(Fp8MlaLayout, RegistersWithTheSpecifiedRowSizes) {
  load_plugins();
  LoadedModel m = kiln::testing::load_recipe_model(sets("glm4_moe_lite-tiny", "fp8_ds_mla"));
  const KvGeometry g = m.layout->geometry();
  EXPECT_EQ(m.layout->bytes_per_token(), static_cast<size_t>(RowGeometry{g.latent_dim, g.rope_dim}.bytes()));
  EXPECT_LT(m.layout->bytes_per_token(), static_cast<size_t>(2 * (g.latent_dim + g.rope_dim)));
}

// Random rows through append, then attend (all keys, and a DSA-style selection with padding) against exact fp32
// attention over the rows decode_row gives back; gather returns those rows. Against the `bf16` layout over the
// same inputs the output moves by e4m3's rounding only.
TEST(Fp8MlaLayout, AttentionOverPagesIsExactAttentionOverTheirDequantizedRows) {
  load_plugins();
  LoadedModel fp8 = kiln::testing::load_recipe_model(sets("glm4_moe_lite-tiny", "fp8_ds_mla"));
  LoadedModel bf16 = kiln::testing::load_recipe_model(sets("glm4_moe_lite-tiny", "bf16"));
  const KvGeometry g = fp8.layout->geometry();
  const int64_t L = g.latent_dim, R = g.rope_dim, W = L + R, bs = g.block_size, heads = 3, keys = 37;
  const RowGeometry row{L, R};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(keys * W), q(2 * heads * W);
  for (float& x : rows) x = normal(rng);
  for (float& x : q) x = 0.3f * normal(rng);
  const int64_t blocks = (keys + bs - 1) / bs + 1;
  std::vector<int32_t> table;  // pages in reverse order, so slots are not positions
  for (int64_t b = blocks - 1; b >= 0; --b) table.push_back(static_cast<int32_t>(b));
  std::vector<int64_t> slots(keys);
  for (int64_t t = 0; t < keys; ++t) slots[t] = table[t / bs] * bs + t % bs;
  std::vector<uint8_t> pages(static_cast<size_t>(blocks * bs * row.bytes()));
  std::vector<uint16_t> pages_bf16(static_cast<size_t>(blocks * bs * W));
  KvAppendArgs append;
  append.slots = slots.data(), append.n = keys, append.rows = rows.data();
  append.pages = pages.data();
  ASSERT_TRUE(fp8.layout->append(append, {}).ok());
  append.pages = pages_bf16.data();
  ASSERT_TRUE(bf16.layout->append(append, {}).ok());

  std::vector<float> decoded(keys * W);
  for (int64_t t = 0; t < keys; ++t) decode_row(row, pages.data() + slots[t] * row.bytes(), decoded.data() + t * W);
  std::vector<float> gathered(keys * W);
  const KvGatherSeq seq{0, 0, static_cast<int32_t>(keys), 0};
  KvGatherArgs ga;
  ga.pages = pages.data(), ga.block_tables = table.data(), ga.max_blocks = blocks, ga.seqs = &seq, ga.num_seqs = 1;
  ga.max_kv_len = keys, ga.out = gathered.data();
  ASSERT_TRUE(fp8.layout->gather(ga, {}).ok());
  EXPECT_EQ(gathered, decoded);

  // Query 0 sees every key; query 1 a selection of 9 (two −1 pads, one position listed twice, one past kv_len).
  const std::vector<int32_t> query_seq = {0, 0}, kv_len = {static_cast<int32_t>(keys), 30};
  const std::vector<int32_t> selected = {0, 5, -1, 7, 7, 12, 29, 33, -1, 2, 20, 21};
  const int64_t width = static_cast<int64_t>(selected.size()) / 2;
  const std::vector<int32_t> select_all(selected.size(), -1);
  for (bool with_selection : {false, true}) {
    SCOPED_TRACE(with_selection ? "selection" : "all keys");
    std::vector<int32_t> sel = selected;
    if (with_selection) {  // query 0 with no selection entries beyond kv_len: take the first row's list as is
    } else {
      sel.clear();
    }
    MlaAttendArgs a;
    a.num_queries = 2, a.num_heads = heads, a.q = q.data(), a.block_tables = table.data(), a.max_blocks = blocks;
    a.query_seq = query_seq.data(), a.kv_len = kv_len.data(), a.scale = 0.7f;
    a.selected = with_selection ? sel.data() : nullptr, a.selected_width = with_selection ? width : 0;
    std::vector<float> out(2 * heads * L), out_bf16(2 * heads * L);
    a.cache = pages.data(), a.out = out.data();
    ASSERT_TRUE(fp8.layout->attend(a, {}).ok());
    a.cache = pages_bf16.data(), a.out = out_bf16.data();
    ASSERT_TRUE(bf16.layout->attend(a, {}).ok());
    double exact_err = 0, bf16_diff = 0, scale = 0;
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<char> visible(static_cast<size_t>(kv_len[r]), !with_selection);
      for (int64_t j = 0; with_selection && j < width; ++j) {
        const int32_t p = sel[r * width + j];
        if (p >= 0 && p < kv_len[r]) visible[p] = 1;
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float* qh = q.data() + (r * heads + h) * W;
        std::vector<double> s;
        std::vector<int64_t> pos;
        for (int64_t t = 0; t < kv_len[r]; ++t) {
          if (!visible[t]) continue;
          double dot = 0;
          for (int64_t i = 0; i < W; ++i) dot += static_cast<double>(qh[i]) * decoded[t * W + i];
          s.push_back(0.7 * dot), pos.push_back(t);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < L; ++i) {
          double want = 0;
          for (size_t j = 0; j < s.size(); ++j) want += s[j] / sum * decoded[pos[j] * W + i];
          const float got = out[(r * heads + h) * L + i], other = out_bf16[(r * heads + h) * L + i];
          exact_err = std::max(exact_err, std::fabs(got - want));
          bf16_diff = std::max(bf16_diff, static_cast<double>(std::fabs(got - other)));
          scale = std::max(scale, std::fabs(want));
        }
      }
    }
    std::printf("fp8_ds_mla attend (%s): |fp8 − exact over dequantized rows| %.3g, |fp8 − bf16 layout| %.3g, of "
                "max |out| %.3g\n", with_selection ? "selection" : "all keys", exact_err, bf16_diff, scale);
    EXPECT_LT(exact_err, 1e-5 * scale);
    EXPECT_LT(bf16_diff, 0.1 * scale);
    EXPECT_GT(bf16_diff, 0.0) << "e4m3 rounding left the output exactly as bf16's: the pages are not fp8";
  }
}

// The whole model on fp8 pages against the same model on bf16 pages: the prompt's logits rows (max |Δ| of a row's
// largest |logit|) and 24 greedy tokens. The random fixtures' margins are small (their greedy agreement is
// reported); the trained tiny-glm's are real and must agree.
struct DriftCase {
  const char* model;
  double max_mean_drift;
  int min_agreeing;  // of 24 greedy tokens (from the start: identical up to there)
};

class Fp8MlaModels : public ::testing::TestWithParam<DriftCase> {};

TEST_P(Fp8MlaModels, LogitDriftAndGreedyAgreementAgainstBf16) {
  load_plugins();
  const DriftCase c = GetParam();
  LoadedModel fp8 = kiln::testing::load_recipe_model(sets(c.model, "fp8_ds_mla"));
  LoadedModel bf16 = kiln::testing::load_recipe_model(sets(c.model, "bf16"));
  const int64_t vocab = fp8.model->vocab_size();
  // The trained model reads text like its training text (Python's documentation); the random fixtures take tokens.
  std::vector<int32_t> prompt = random_prompt(90, vocab, 5);
  if (std::string(c.model) == "tiny-glm") {
    auto tok = Tokenizer::load(model_path(c.model) / "tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    prompt = tok->encode(
        "Return a new sorted list from the items in iterable. A custom key function can be supplied to customize the "
        "sort order, and the reverse flag can be set to request the result in descending order. The built-in "
        "sorted() function is guaranteed to be stable. A sort is stable if it guarantees not to change the relative "
        "order of elements that compare equal");
  }
  const std::vector<float> a = prompt_logits(fp8, prompt), b = prompt_logits(bf16, prompt);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0, sum = 0;
  const int64_t rows = static_cast<int64_t>(a.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const double e = kiln::testing::relative_error(a.data() + r * vocab, b.data() + r * vocab, vocab);
    worst = std::max(worst, e), sum += e;
  }
  auto ga = kiln::testing::engine_generate(fp8, sets(c.model, "fp8_ds_mla"), prompt, 24);
  auto gb = kiln::testing::engine_generate(bf16, sets(c.model, "bf16"), prompt, 24);
  ASSERT_TRUE(ga.ok() && gb.ok()) << ga.status().to_string() << " " << gb.status().to_string();
  ASSERT_EQ(ga->size(), 24u);
  ASSERT_EQ(gb->size(), 24u);
  int same = 0;
  while (same < 24 && (*ga)[same] == (*gb)[same]) ++same;
  std::printf("%s: fp8_ds_mla vs bf16 KV, %lld prompt rows: logits drift worst %.3g mean %.3g of a row's largest; "
              "greedy identical for %d of 24 tokens\n",
              c.model, static_cast<long long>(rows), worst, sum / rows, same);
  EXPECT_LE(sum / rows, c.max_mean_drift);
  EXPECT_GE(same, c.min_agreeing);
}

INSTANTIATE_TEST_SUITE_P(Architectures, Fp8MlaModels,
                         // Bounds 1.5× the mean drift measured (2026-12-02): random fixtures route and select by
                         // near-ties, so e4m3's 6 % steps move them far (and their greedy text parts early); the
                         // trained model moves 1.6 % and keeps all 24 tokens. glm_moe_dsa: 0.408 since 2026-12-03,
                         // its indexer keys fp8 too (fp8 vs fp32 keys alone, on fp8 latent pages: 0.394 in
                         // fp8_indexer_keys_test.cpp).
                         ::testing::Values(DriftCase{"glm4_moe_lite-tiny", 0.08, 0}, DriftCase{"deepseek_v3-tiny", 0.12, 0},
                                           DriftCase{"glm_moe_dsa-tiny", 0.6, 0}, DriftCase{"glm5_next-tiny", 0.05, 0},
                                           DriftCase{"tiny-glm", 0.025, 24}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Decode-context parallelism on fp8 pages: each rank quantizes and stores its own tokens' rows (a row's bytes are
// the same whichever rank holds it) and attends over them, merged by log-sum-exp; GLM-5's indexer keys are fp8 too
// and gathered as scores (its selection is one rank's exactly). So one group of 2 (parallel.tensor = 2,
// decode_context = 2) gives one rank's greedy tokens, and its prompt logits up to fp32 summation order: the layout's
// own attention and the split's partial attention sum q·k and the softmax in different orders (~1e-7 per value).
// glm_moe_dsa-tiny grows that to 1e-3 (measured, bf16 pages 3e-4, fp32 pages 9e-7; its selections were checked equal
// to one rank's, so the growth is its near-tie routing, as the drift test above says); the others stay at ~1e-6.
TEST(Fp8MlaDecodeContext, SplitRanksOnFp8PagesAgreeWithOneRank) {
  load_plugins();
  const std::pair<const char*, double> cases[] = {
      {"glm4_moe_lite-tiny", 1e-5}, {"glm_moe_dsa-tiny", 5e-3}, {"glm5_next-tiny", 1e-5}};
  for (const auto& [model, bound] : cases) {
    SCOPED_TRACE(model);
    const std::vector<std::string> split_keys = {"parallel.tensor=2", "parallel.decode_context=2", "model.threads=2"};
    LoadedModel one = kiln::testing::load_recipe_model(sets(model, "fp8_ds_mla", {"model.threads=2"}));
    LoadedModel split = kiln::testing::load_recipe_model(sets(model, "fp8_ds_mla", split_keys));
    ASSERT_NE(one.model, nullptr);
    ASSERT_NE(split.model, nullptr);
    const int64_t vocab = one.model->vocab_size();
    const std::vector<int32_t> prompt = random_prompt(90, vocab, 9);
    const std::vector<float> a = prompt_logits(one, prompt), b = prompt_logits(split, prompt);
    ASSERT_EQ(a.size(), b.size());
    double worst = 0;
    for (int64_t r = 0; r < static_cast<int64_t>(a.size()) / vocab; ++r)
      worst = std::max(worst, kiln::testing::relative_error(b.data() + r * vocab, a.data() + r * vocab, vocab));
    std::printf("%s on fp8_ds_mla: DCP 2 vs one rank, prompt logits worst %.3g of a row's largest\n", model, worst);
    EXPECT_LT(worst, bound);
    auto ga = kiln::testing::engine_generate(one, sets(model, "fp8_ds_mla", {"model.threads=2"}), prompt, 16);
    auto gb = kiln::testing::engine_generate(split, sets(model, "fp8_ds_mla", split_keys), prompt, 16);
    ASSERT_TRUE(ga.ok() && gb.ok()) << ga.status().to_string() << " " << gb.status().to_string();
    EXPECT_EQ(*gb, *ga);
  }
}

// One engine, the trained tiny-glm on fp8 pages: a prompt decoded in one step and in chunks of 7 gives the same
// tokens; the same request again (its prompt's blocks now cached) gives them again with prefix-cache hits; and MTP
// drafting at depths 1..5 on the same layout leaves them unchanged.
TEST(Fp8MlaEngine, OutputDoesNotDependOnChunkingPrefixCachingOrDrafting) {
  load_plugins();
  const std::vector<std::string> base = sets("tiny-glm", "fp8_ds_mla", {"speculative.method=none", "speculative.depth=0"});
  LoadedModel m = kiln::testing::load_recipe_model(base, {.load_mtp = true});
  const std::vector<int32_t> prompt = random_prompt(70, m.model->vocab_size(), 9);
  auto plain = kiln::testing::engine_generate(m, base, prompt, 32);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();

  std::vector<std::string> chunked = base;
  chunked.push_back("scheduler.max_num_batched_tokens=7");
  auto c = kiln::testing::engine_generate(m, chunked, prompt, 32);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c, *plain) << "chunks of 7";

  auto recipe = load_recipe("", base, global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto e = start_engine(m, *recipe);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  for (int round = 0; round < 2; ++round) {
    RequestParams p;
    p.prompt = prompt;
    p.max_tokens = 32;
    auto out = run_single_request(*e->engine, std::move(p));
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(*out, *plain) << "round " << round;
  }
  EXPECT_GT(e->engine->metrics().prefix_cache_hits, 0) << "the second request hit no cached block";

  for (int depth = 1; depth <= 5; ++depth) {
    SCOPED_TRACE("mtp depth " + std::to_string(depth));
    std::vector<std::string> drafted = sets("tiny-glm", "fp8_ds_mla",
                                            {"speculative.method=mtp", "speculative.depth=" + std::to_string(depth)});
    EngineMetrics metrics;
    auto d = kiln::testing::engine_generate(m, drafted, prompt, 32, {}, {}, &metrics);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(*d, *plain);
    EXPECT_GT(metrics.spec_accepted_tokens, 0) << "no draft was accepted: drafting did not run";
  }
}

}  // namespace
}  // namespace kiln::fp8mla
