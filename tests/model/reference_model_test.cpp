// The CPU forward pass against transformers 5.17 (tests/data/models/*/reference.safetensors, made by
// tools/make_reference.py). Tolerance: max|Δ| / max|ref| < 1e-4 with the exact (fp32) KV layout; the bf16
// layout rounds cached latents to 8 mantissa bits, so it is held to 2e-2 and to the same greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "kiln/drafter.h"
#include "model/model_loader.h"
#include "model/safetensors_file.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {
using testing::cpu_model;
using testing::make_kv_cache;
namespace fs = std::filesystem;

using testing::load_reference;
using testing::relative_error;
using testing::Reference;
using testing::model_dir;
using testing::cpu_model;
using testing::engine_generate;
using testing::make_kv_cache;

LoadedModel load(const std::string& name, const std::string& layout) {
  auto recipe = load_recipe("", {"model.path=" + model_dir(name).string(), "kv.layout=" + layout, "kv.block_size=4"},
                            global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

class ReferenceModel : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceModel, PrefillLogitsMatchTransformers) {
  Reference ref = load_reference(GetParam());
  LoadedModel m = load(GetParam(), "fp32");
  const auto prompt = ref.ids("prompt_ids");
  const auto expected = ref.floats("prefill_logits");
  for (MlaForm form : {MlaForm::kExpanded, MlaForm::kAbsorbed}) {
    cpu_model(m).set_mla_form(form);
    auto kv = make_kv_cache(m, 64);
    std::vector<int32_t> table;
    ASSERT_TRUE(kv->reserve(table, static_cast<int64_t>(prompt.size())).ok());
    SequenceStep step{prompt, 0, &table, true};
    StepOutput out;
    ASSERT_TRUE(cpu_model(m).forward({&step, 1}, kv->views(), {}, out).ok());
    ASSERT_EQ(out.logits.size(), expected.size());
    EXPECT_LT(relative_error(out.logits.data(), expected.data(), expected.size()), 1e-4)
        << (form == MlaForm::kExpanded ? "expanded" : "absorbed");
  }
}

// A drafter's taps against transformers' hidden_states: layer l's output (hidden_states[l + 1]; the last layer's
// before the final norm: last_layer_prenorm) and the final-normed rows (hidden_states[L]), asked out of order and one
// layer twice (each copy filled), from the prompt's second chunk (that chunk's rows). fp32: within 1e-4 as the logits.
TEST_P(ReferenceModel, LayerTapsAreTheHiddenStatesTransformersRecords) {
  Reference ref = load_reference(GetParam());
  LoadedModel m = load(GetParam(), "fp32");
  const auto prompt = ref.ids("prompt_ids");
  const auto hidden = ref.floats("hidden_states"), prenorm = ref.floats("last_layer_prenorm");
  const int64_t n = static_cast<int64_t>(prompt.size()), hd = m.model->hidden_size();
  const int64_t L = static_cast<int64_t>(hidden.size()) / (n * hd) - 1;
  ASSERT_EQ(static_cast<int64_t>(hidden.size()), (L + 1) * n * hd);
  StepOptions o;
  for (int64_t l = L - 1; l >= 0; --l) o.tap_layers.push_back(static_cast<int>(l));
  o.tap_layers.push_back(kTapFinalNormed);
  o.tap_layers.push_back(0);
  auto kv = make_kv_cache(m, 64);
  std::vector<int32_t> table;
  ASSERT_TRUE(kv->reserve(table, n).ok());
  const int64_t first = n / 3;
  StepOutput out;
  SequenceStep head{std::span<const int32_t>(prompt.data(), first), 0, &table, false};
  ASSERT_TRUE(cpu_model(m).forward({&head, 1}, kv->views(), {}, out).ok());
  SequenceStep rest{std::span<const int32_t>(prompt.data() + first, n - first), first, &table, false};
  ASSERT_TRUE(cpu_model(m).forward({&rest, 1}, kv->views(), o, out).ok());
  ASSERT_EQ(out.taps.size(), o.tap_layers.size());
  for (size_t t = 0; t < o.tap_layers.size(); ++t) {
    const int tap = o.tap_layers[t];
    const float* want = tap == kTapFinalNormed ? hidden.data() + (L * n + first) * hd
                        : tap == L - 1        ? prenorm.data() + first * hd
                                              : hidden.data() + ((tap + 1) * n + first) * hd;
    ASSERT_EQ(out.taps[t].numel(), (n - first) * hd);
    EXPECT_LT(relative_error(static_cast<const float*>(out.taps[t].data), want, (n - first) * hd), 1e-4)
        << "tap " << t << " (layer " << tap << ")";
  }
}

TEST_P(ReferenceModel, GreedyDecodeMatchesTransformers) {
  Reference ref = load_reference(GetParam());
  LoadedModel m = load(GetParam(), "fp32");
  const auto prompt = ref.ids("prompt_ids");
  const auto greedy = ref.ids("greedy_ids");
  const auto decode_logits = ref.floats("decode_logits");
  const int64_t vocab = cpu_model(m).config().vocab_size;
  auto kv = make_kv_cache(m, 64);
  std::vector<int32_t> table;
  ASSERT_TRUE(kv->reserve(table, static_cast<int64_t>(prompt.size() + greedy.size())).ok());
  StepOutput out;
  SequenceStep prefill{prompt, 0, &table, false};
  ASSERT_TRUE(cpu_model(m).forward({&prefill, 1}, kv->views(), {}, out).ok());
  for (size_t i = 0; i < greedy.size(); ++i) {
    EXPECT_LT(relative_error(out.logits.data(), decode_logits.data() + i * vocab, vocab), 1e-4) << "step " << i;
    int32_t next = static_cast<int32_t>(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin());
    ASSERT_EQ(next, greedy[i]) << "step " << i;
    SequenceStep step{std::span<const int32_t>(&greedy[i], 1), static_cast<int64_t>(prompt.size() + i), &table, false};
    ASSERT_TRUE(cpu_model(m).forward({&step, 1}, kv->views(), {}, out).ok());
  }
}

TEST_P(ReferenceModel, BatchOfSequencesAtDifferentPositions) {
  Reference ref = load_reference(GetParam());
  LoadedModel m = load(GetParam(), "fp32");
  const auto p1 = ref.ids("prompt_ids"), p2 = ref.ids("prompt2_ids");
  const auto l1 = ref.floats("prefill_logits"), l2 = ref.floats("prompt2_logits");
  const int64_t vocab = cpu_model(m).config().vocab_size;
  auto kv = make_kv_cache(m, 128);
  std::vector<int32_t> t1, t2;
  ASSERT_TRUE(kv->reserve(t1, static_cast<int64_t>(p1.size())).ok());
  ASSERT_TRUE(kv->reserve(t2, static_cast<int64_t>(p2.size())).ok());
  // Sequence 1 prefilled to position 10 first, then one batch carries its remaining 14 tokens and all of
  // sequence 2: two sequences at different positions, chunked prefill, in one call.
  StepOutput out;
  SequenceStep first{std::span<const int32_t>(p1.data(), 10), 0, &t1, true};
  ASSERT_TRUE(cpu_model(m).forward({&first, 1}, kv->views(), {}, out).ok());
  EXPECT_LT(relative_error(out.logits.data(), l1.data(), 10 * vocab), 1e-4);
  std::vector<SequenceStep> batch = {{std::span<const int32_t>(p1.data() + 10, p1.size() - 10), 10, &t1, true},
                                     {p2, 0, &t2, true}};
  ASSERT_TRUE(cpu_model(m).forward(batch, kv->views(), {}, out).ok());
  EXPECT_LT(relative_error(out.logits.data() + out.first_row[0] * vocab, l1.data() + 10 * vocab, (p1.size() - 10) * vocab),
            1e-4);
  EXPECT_LT(relative_error(out.logits.data() + out.first_row[1] * vocab, l2.data(), p2.size() * vocab), 1e-4);
}

TEST_P(ReferenceModel, Bf16KvKeepsGreedyTokens) {
  Reference ref = load_reference(GetParam());
  LoadedModel m = load(GetParam(), "bf16");
  const auto prompt = ref.ids("prompt_ids");
  const auto greedy = ref.ids("greedy_ids");
  // Through the engine, its prompt chunked 7 tokens at a time.
  auto ids = engine_generate(m,
                             {"model.path=" + model_dir(GetParam()).string(), "kv.layout=bf16", "kv.block_size=4",
                              "scheduler.max_num_seqs=1", "scheduler.max_num_batched_tokens=7"},
                             prompt, static_cast<int64_t>(greedy.size()));
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, greedy);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceModel,
                         ::testing::Values("glm4_moe_lite-tiny", "glm_moe_dsa-tiny", "deepseek_v3-tiny"));
// DSA variants (tools/README.md): other indexer head counts and head dims, index_topk below the prompt length,
// dense/sparse MLP patterns other than a dense prefix, shared indexer layers, and the other spellings of the
// schedules in config.json (index_topk_pattern, index_topk_freq, first_k_dense_replace).
INSTANTIATE_TEST_SUITE_P(DsaVariants, ReferenceModel,
                         ::testing::Values("glm_moe_dsa-h5d32", "glm_moe_dsa-h3d16-shared", "glm_moe_dsa-h4d24-freq"));

// Config variants (tools/README.md, "Config variants"): 2/3/5 heads, qk_nope != v_head, qk_rope 4/6, the direct
// q_proj path (q_lora_rank null), 0/2 shared experts, top-1 and grouped routing, unnormalised routing weights, all-MoE
// and all-dense stacks, tied lm_head, YaRN with mscale != mscale_all_dim and DeepSeek-V2-Lite's rope_scaling,
// rotate-half rope, Moonlight's `"rope_scaling": null`, linear and llama3 rope.
INSTANTIATE_TEST_SUITE_P(ConfigVariants, ReferenceModel,
                         ::testing::Values("glm4_moe_lite-h3-qproj", "glm4_moe_lite-h5-yarn-groups",
                                           "glm4_moe_lite-dense-halves", "deepseek_v3-qproj", "deepseek_v3-v2lite-yarn",
                                           "deepseek_v3-dense-tied", "deepseek_v3-linear-rope",
                                           "glm4_moe_lite-llama3-rope"));

// What each config variant is meant to exercise, read back through kiln's parser (as ConfigsParseToTheIntendedSchedules
// below for the DSA variants): a regenerated fixture that quietly stopped varying an option fails here.
TEST(ConfigVariants, ConfigsParseToTheIntendedOptions) {
  struct Expect {
    const char* name;
    int64_t heads, q_lora, nope, rope, v, shared, top_k, n_group, topk_group;
    bool norm_topk, tied, interleave;
    RopeType rope_type;
    double mscale, mscale_all_dim;
    std::vector<bool> moe;
  };
  using enum RopeType;
  for (const Expect& e : std::vector<Expect>{
           {"glm4_moe_lite-h3-qproj", 3, 0, 12, 8, 20, 2, 1, 1, 1, false, false, true, kDefault, 0, 0, {true, true, true}},
           {"glm4_moe_lite-h5-yarn-groups", 5, 24, 16, 4, 8, 0, 3, 4, 2, true, true, true, kYarn, 1.0, 0.5,
            {false, true, true}},
           {"glm4_moe_lite-dense-halves", 2, 32, 10, 6, 12, 1, 2, 1, 1, true, false, false, kDefault, 0, 0,
            {false, false, false}},
           {"deepseek_v3-qproj", 3, 0, 16, 8, 12, 2, 2, 1, 1, true, false, true, kDefault, 0, 0, {false, true, true}},
           {"deepseek_v3-v2lite-yarn", 5, 32, 16, 4, 20, 1, 3, 4, 2, false, false, true, kYarn, 0.707, 0.707,
            {true, true, true}},
           {"deepseek_v3-linear-rope", 2, 32, 16, 8, 16, 1, 2, 1, 1, true, false, true, kLinear, 0, 0,
            {false, true, true}},
           {"glm4_moe_lite-llama3-rope", 4, 32, 16, 8, 16, 1, 2, 1, 1, true, false, true, kLlama3, 0, 0,
            {false, true, true}},
           {"deepseek_v3-dense-tied", 4, 32, 16, 8, 16, 1, 2, 8, 4, true, true, true, kYarn, 1.0, 0,
            {false, false, false}}}) {
    SCOPED_TRACE(e.name);
    LoadedModel m = load(e.name, "fp32");
    const ModelConfig& c = cpu_model(m).config();
    EXPECT_EQ(c.num_attention_heads, e.heads);
    EXPECT_EQ(c.q_lora_rank, e.q_lora);
    EXPECT_EQ(c.qk_nope_head_dim, e.nope);
    EXPECT_EQ(c.qk_rope_head_dim, e.rope);
    EXPECT_EQ(c.v_head_dim, e.v);
    EXPECT_EQ(c.n_shared_experts, e.shared);
    EXPECT_EQ(c.num_experts_per_tok, e.top_k);
    EXPECT_EQ(c.n_group, e.n_group);
    EXPECT_EQ(c.topk_group, e.topk_group);
    EXPECT_EQ(c.norm_topk_prob, e.norm_topk);
    EXPECT_EQ(c.tie_word_embeddings, e.tied);
    EXPECT_EQ(c.rope.interleave, e.interleave);
    EXPECT_EQ(c.rope.type, e.rope_type);
    EXPECT_DOUBLE_EQ(c.rope.mscale, e.mscale);
    EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, e.mscale_all_dim);
    ASSERT_EQ(c.num_hidden_layers, 3);
    for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(c.is_moe(l), e.moe[l]) << "layer " << l;
    // A tied checkpoint has no lm_head tensor: the embedding serves as the head.
    EXPECT_EQ(SafetensorsFile::open(model_dir(e.name) / "model.safetensors")->has("lm_head.weight"), !e.tied);
  }
}

// What each DSA variant is meant to exercise, read back through kiln's config parser: a fixture that silently
// stopped varying (say, a regenerated config.json spelling the schedules differently) would otherwise still pass.
TEST(DsaVariants, ConfigsParseToTheIntendedSchedules) {
  struct Expect {
    const char* name;
    int64_t heads, head_dim, topk;
    std::vector<bool> moe, shared;
  };
  for (const Expect& e : std::vector<Expect>{
           {"glm_moe_dsa-h5d32", 5, 32, 6, {false, true, false, true}, {false, false, false, false}},
           {"glm_moe_dsa-h3d16-shared", 3, 16, 8, {false, false, true, true}, {false, true, true, false}},
           {"glm_moe_dsa-h4d24-freq", 4, 24, 5, {true, false, true, false}, {false, false, true, false}}}) {
    SCOPED_TRACE(e.name);
    LoadedModel m = load(e.name, "fp32");
    const ModelConfig& c = cpu_model(m).config();
    EXPECT_EQ(c.index_n_heads, e.heads);
    EXPECT_EQ(c.index_head_dim, e.head_dim);
    EXPECT_EQ(c.index_topk, e.topk);
    EXPECT_LT(c.index_topk, static_cast<int64_t>(load_reference(e.name).ids("prompt_ids").size()));
    EXPECT_GT(c.index_head_dim, c.qk_rope_head_dim);  // roped and pass-through parts both present
    ASSERT_EQ(c.num_hidden_layers, 4);
    for (int64_t l = 0; l < 4; ++l) {
      EXPECT_EQ(c.is_moe(l), e.moe[l]) << "layer " << l;
      EXPECT_EQ(c.indexer_is_shared(l), e.shared[l]) << "layer " << l;
    }
  }
}

// The variants are built without exact ties at any top-k cut (tools/make_reference.py refuses gaps < 1e-4), so the
// selection is well defined and kiln must report no tied row; a tie-laden row set reports them.
TEST(DsaVariants, NoTopkCutFallsInsideATie) {
  for (const char* name : {"glm_moe_dsa-tiny", "glm_moe_dsa-h5d32", "glm_moe_dsa-h3d16-shared", "glm_moe_dsa-h4d24-freq"}) {
    SCOPED_TRACE(name);
    Reference ref = load_reference(name);
    LoadedModel m = load(name, "fp32");
    const auto prompt = ref.ids("prompt_ids");
    auto kv = make_kv_cache(m, 64);
    std::vector<int32_t> table;
    ASSERT_TRUE(kv->reserve(table, static_cast<int64_t>(prompt.size())).ok());
    SequenceStep step{prompt, 0, &table, false};
    StepOutput out;
    ASSERT_TRUE(cpu_model(m).forward({&step, 1}, kv->views(), {}, out).ok());
    EXPECT_EQ(cpu_model(m).indexer_tied_rows(), 0);
  }
}

// A checkpoint as a new user makes it (3 indexer heads of 16, top-8 below the prompt, nothing arranged against
// ties): top-k cuts fall inside exact ties of index scores (keys scoring exactly 0), and which tied keys a query keeps
// decides its output. The CPU follows torch.topk's CPU procedure over the same rows, so prefill logits and the
// cached greedy continuation match transformers. (Keeping the lowest tied positions instead diverges.)
TEST(DsaTies, GreedyContinuationMatchesTransformersThroughExactTies) {
  const std::string name = "glm_moe_dsa-h3d16-ties";
  Reference ref = load_reference(name);
  LoadedModel m = load(name, "fp32");
  const auto prompt = ref.ids("prompt_ids");
  const auto greedy = ref.ids("greedy_ids");
  const auto prefill_logits = ref.floats("prefill_logits");
  const auto decode_logits = ref.floats("decode_logits");
  const int64_t vocab = cpu_model(m).config().vocab_size;
  auto kv = make_kv_cache(m, 64);
  std::vector<int32_t> table;
  ASSERT_TRUE(kv->reserve(table, static_cast<int64_t>(prompt.size() + greedy.size())).ok());
  StepOutput out;
  SequenceStep prefill{prompt, 0, &table, true};
  ASSERT_TRUE(cpu_model(m).forward({&prefill, 1}, kv->views(), {}, out).ok());
  EXPECT_LT(relative_error(out.logits.data(), prefill_logits.data(), prefill_logits.size()), 1e-4);
  EXPECT_GT(cpu_model(m).indexer_tied_rows(), 0) << "the fixture no longer exercises ties";
  std::vector<float> last(out.logits.end() - vocab, out.logits.end());
  for (size_t i = 0; i < greedy.size(); ++i) {
    EXPECT_LT(relative_error(last.data(), decode_logits.data() + i * vocab, vocab), 1e-4) << "step " << i;
    const int32_t next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    ASSERT_EQ(next, greedy[i]) << "step " << i;
    SequenceStep step{std::span<const int32_t>(&greedy[i], 1), static_cast<int64_t>(prompt.size() + i), &table, false};
    ASSERT_TRUE(cpu_model(m).forward({&step, 1}, kv->views(), {}, out).ok());
    last.assign(out.logits.begin(), out.logits.end());
  }
}

// The same fixture through the engine with its prompt in chunks (7 and 5 tokens, and token by token): the greedy
// tokens are transformers' whatever the chunking. This fixture's tied cuts happen to pick the same keys for either
// row length, so the test also passes with the engine leaving SequenceStep::prompt_length unset; what the length
// decides is tested in DsaIndexer.RowLengthsRankOverTransformersRow and the multi-token step below.
TEST(DsaTies, ChunkedPromptsKeepTransformersTokens) {
  const std::string name = "glm_moe_dsa-h3d16-ties";
  Reference ref = load_reference(name);
  LoadedModel m = load(name, "fp32");
  const auto prompt = ref.ids("prompt_ids");
  const auto greedy = ref.ids("greedy_ids");
  for (const char* chunk : {"1", "5", "7", "2048"}) {
    auto ids = engine_generate(m,
                               {"model.path=" + model_dir(name).string(), "kv.layout=fp32", "kv.block_size=4",
                                "scheduler.max_num_seqs=1", std::string("scheduler.max_num_batched_tokens=") + chunk},
                               prompt, static_cast<int64_t>(greedy.size()));
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, greedy) << "prompt chunks of " << chunk;
  }
}

// A verification pass (the last token and 4 drafts in one step) ranks each query's keys over the row its own decode
// step would have: its rows' logits are the one-token steps' (transformers' decode_logits).
TEST(DsaTies, AMultiTokenDecodeStepRanksAsTokenByToken) {
  const std::string name = "glm_moe_dsa-h3d16-ties";
  Reference ref = load_reference(name);
  LoadedModel m = load(name, "fp32");
  const auto prompt = ref.ids("prompt_ids");
  const auto greedy = ref.ids("greedy_ids");
  const auto decode_logits = ref.floats("decode_logits");
  const int64_t vocab = cpu_model(m).config().vocab_size, P = static_cast<int64_t>(prompt.size());
  auto kv = make_kv_cache(m, 64);
  std::vector<int32_t> table;
  ASSERT_TRUE(kv->reserve(table, P + static_cast<int64_t>(greedy.size())).ok());
  StepOutput out;
  SequenceStep prefill{prompt, 0, &table, false};
  prefill.prompt_length = P;
  ASSERT_TRUE(cpu_model(m).forward({&prefill, 1}, kv->views(), {}, out).ok());
  const int64_t k = 5;
  ASSERT_GE(static_cast<int64_t>(greedy.size()), k + 1);
  SequenceStep pass{std::span<const int32_t>(greedy.data(), k), P, &table, true};
  pass.prompt_length = P;
  ASSERT_TRUE(cpu_model(m).forward({&pass, 1}, kv->views(), {}, out).ok());
  ASSERT_EQ(out.logits.size(), static_cast<size_t>(k * vocab));
  for (int64_t i = 0; i < k; ++i) {
    const float* row = out.logits.data() + i * vocab;
    EXPECT_LT(relative_error(row, decode_logits.data() + (i + 1) * vocab, vocab), 1e-4) << "row " << i;
    EXPECT_EQ(std::max_element(row, row + vocab) - row, greedy[i + 1]) << "row " << i;
  }
}

TEST(ModelLoad, ErrorsNameTheProblem) {
  auto recipe = load_recipe("", {"model.path=/nonexistent/model"}, global_registry());
  ASSERT_TRUE(recipe.ok());
  auto m = load_model(*recipe, global_registry());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The MTP layer against the fixture's reference (tools/README.md): row i conditions on the trunk's
// final-normed hidden state h_i and token t_{i+1}, at position i of the MTP layer's own KV.
TEST(MtpLayer, LogitsMatchReference) {
  auto f = SafetensorsFile::open(model_dir("glm4_moe_lite-tiny") / "reference.safetensors");
  ASSERT_TRUE(f.ok());
  Reference ref{std::move(f).value()};
  auto recipe = load_recipe("", {"model.path=" + model_dir("glm4_moe_lite-tiny").string(), "kv.layout=fp32"},
                            global_registry());
  ASSERT_TRUE(recipe.ok());
  auto m = load_model(*recipe, global_registry(), {.load_mtp = true});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(cpu_model(*m).weights().mtp.size(), 1u);
  const auto prompt = ref.ids("prompt_ids");
  const auto expected = ref.floats("mtp_logits");
  const int64_t T = static_cast<int64_t>(prompt.size()), H = cpu_model(*m).config().hidden_size;
  auto kv = make_kv_cache(*m, 128);  // two sequences' worth: the trunk's and the MTP layer's tables
  std::vector<int32_t> table, mtp_table;
  ASSERT_TRUE(kv->reserve(table, T).ok());
  ASSERT_TRUE(kv->reserve(mtp_table, T).ok());
  StepOutput trunk;
  SequenceStep step{prompt, 0, &table, false};
  ASSERT_TRUE(cpu_model(*m).forward({&step, 1}, kv->views(), {.want_hidden = true}, trunk).ok());
  ASSERT_EQ(static_cast<int64_t>(trunk.hidden.size()), T * H);
  // Two chunks, to exercise the MTP layer's own KV across calls.
  StepOutput out;
  std::vector<float> got;
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 9}, {9, T - 1}}) {
    SequenceStep mtp{std::span<const int32_t>(prompt.data() + begin + 1, end - begin), begin, &mtp_table, true};
    ASSERT_TRUE(cpu_model(*m).mtp_forward(0, {&mtp, 1}, trunk.hidden.data() + begin * H, kv->views(), out).ok());
    got.insert(got.end(), out.logits.begin(), out.logits.end());
  }
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_LT(relative_error(got.data(), expected.data(), expected.size()), 1e-4);
}

// A checkpoint without next-n layers loads with load_mtp set (a drafter that needs none may run on it); the MTP
// drafter's refusal is the engine's (tests/speculative/weightless_drafter_test.cpp).
TEST(MtpLayer, ACheckpointWithoutThemLoadsWithNone) {
  auto recipe = load_recipe("", {"model.path=" + model_dir("deepseek_v3-tiny").string()}, global_registry());
  ASSERT_TRUE(recipe.ok());
  auto m = load_model(*recipe, global_registry(), {.load_mtp = true});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->model->num_mtp_layers(), 0);
}

}  // namespace
}  // namespace kiln
