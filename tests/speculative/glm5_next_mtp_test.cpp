// glm5_next's next-n (MTP) layer on the CPU with the `mtp` drafter (fixtures tests/data/models/glm5_next-mtp-*,
// tools/make_mtp_fixtures_glm5_next.py). transformers does not model the layer, so there is no reference output:
// correctness is lossless drafting (greedy output with drafts equals greedy output without), the layouts read from
// the checkpoint's names, and for the KDA kind that the layer's state follows exactly the accepted rows however
// many drafts ran through it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/glm5_next_test_model.h"
#include "kiln/drafter.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/arch/glm5_next/glm5_next_mtp_layout.h"
#include "speculative/speculative_test_support.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using glm5_next::AttentionKind;
using testing::model_dir;

const glm5_next::Glm5NextConfig& config_of(const Architecture& arch) {
  return dynamic_cast<const arch::Glm5NextArchitecture&>(arch).config();
}

std::vector<std::string> sets(const std::string& model, const std::string& method, int depth) {
  return {"model.path=" + model_dir(model).string(),
          "model.device=cpu",
          "model.threads=1",
          "kv.layout=fp32",
          "kv.block_size=16",
          "scheduler.max_model_len=512",
          "scheduler.max_num_seqs=2",
          "speculative.method=" + method,
          "speculative.depth=" + std::to_string(method == "none" ? 0 : depth)};
}

// Long enough to cross a KDA chunk (64) and every fixture's indexer top-k (at most 32 tokens of pools).
std::vector<int32_t> long_prompt() {
  std::mt19937 rng(7);
  std::vector<int32_t> p;
  for (int i = 0; i < 90; ++i) p.push_back(static_cast<int32_t>(rng() % 500) + 1);
  return p;
}

TEST(Glm5NextMtp, LayoutsAreReadFromTheCheckpointNames) {
  auto dsa = load_architecture(model_dir("glm5_next-mtp-dsa") / "config.json");
  auto kda = load_architecture(model_dir("glm5_next-mtp-kda") / "config.json");
  auto plain = load_architecture(model_dir("glm5_next-mtp-plain") / "config.json");
  auto none = load_architecture(model_dir("glm5_next-tiny") / "config.json");
  ASSERT_TRUE(dsa.ok() && kda.ok() && plain.ok() && none.ok());
  ASSERT_EQ(config_of(**dsa).mtp.size(), 1u);
  const glm5_next::MtpLayerLayout d = config_of(**dsa).mtp[0];
  EXPECT_TRUE(d.attention == AttentionKind::kDsa && d.indexer && d.hyper_connections && d.moe && d.own_head);
  ASSERT_EQ(config_of(**kda).mtp.size(), 1u);
  const glm5_next::MtpLayerLayout k = config_of(**kda).mtp[0];
  EXPECT_TRUE(k.attention == AttentionKind::kKda && k.hyper_connections && !k.moe && !k.own_head);
  ASSERT_EQ(config_of(**plain).mtp.size(), 2u);
  const glm5_next::MtpLayerLayout p = config_of(**plain).mtp[0], p1 = config_of(**plain).mtp[1];
  EXPECT_TRUE(p.attention == AttentionKind::kDsa && !p.indexer && !p.hyper_connections && !p.moe && p.own_head);
  EXPECT_TRUE(p1.attention == AttentionKind::kKda && !p1.hyper_connections && p1.moe && !p1.own_head);
  EXPECT_TRUE(config_of(**none).mtp.empty());
  EXPECT_EQ((*none)->info().num_mtp_layers, 0);
  EXPECT_EQ((*kda)->info().num_mtp_layers, 1);

  // The cache of the next-n layer is its kind's: a state slot for KDA, latent pages (+ indexer rows) for DSA.
  const CacheSpec ks = (*kda)->cache_spec(1, IndexerKeyFormat::kFp32), ds = (*dsa)->cache_spec(1, IndexerKeyFormat::kFp32),
                  ps = (*plain)->cache_spec(1, IndexerKeyFormat::kFp32);
  EXPECT_EQ((*plain)->cache_spec(2, IndexerKeyFormat::kFp32).layers.back().entries.size(), 1u);  // one KDA state slot
  ASSERT_EQ(ks.layers.back().entries.size(), 1u);  // recurrent then conv state, one slot
  EXPECT_EQ(ks.layers.back().entries[0].kind, CacheKind::kState);
  ASSERT_EQ(ds.layers.back().entries.size(), 3u);  // latent, indexer rows, pool keys
  EXPECT_EQ(ds.layers.back().entries[1].kind, CacheKind::kPagedRows);
  ASSERT_EQ(ps.layers.back().entries.size(), 1u);
  EXPECT_EQ(ps.layers.back().entries[0].kind, CacheKind::kMlaLatent);
}

TEST(Glm5NextMtp, AnUnknownLayoutIsRefusedListingItsNames) {
  glm5_next::Glm5NextConfig c;
  c.num_hidden_layers = 2;
  c.num_nextn_predict_layers = 1;
  c.num_nextn_predict_layers_given = true;
  const std::vector<std::string> names = {
      "model.layers.1.input_layernorm.weight",      "model.layers.2.enorm.weight",
      "model.layers.2.hnorm.weight",                "model.layers.2.eh_proj.weight",
      "model.layers.2.shared_head.norm.weight",     "model.layers.2.input_layernorm.weight",
      "model.layers.2.post_attention_layernorm.weight", "model.layers.2.self_attn.wqkv.weight",
      "model.layers.2.mlp.gate_proj.weight",        "model.layers.2.mlp.experts.0.up_proj.weight",
      "model.layers.2.mlp.experts.1.up_proj.weight"};
  glm5_next::read_mtp_layouts(names, c);
  EXPECT_TRUE(c.mtp.empty());
  EXPECT_NE(c.mtp_refusal.find("neither KDA"), std::string::npos) << c.mtp_refusal;
  EXPECT_NE(c.mtp_refusal.find("model.layers.2.self_attn.wqkv.weight"), std::string::npos) << c.mtp_refusal;
  EXPECT_NE(c.mtp_refusal.find("model.layers.2.mlp.experts.*.up_proj.weight"), std::string::npos) << c.mtp_refusal;

  // End to end: a fixture whose next-n attention is renamed (same length, so the header stays valid) loads for
  // plain decoding, and is refused, naming the tensors, when its next-n layer is asked for.
  const fs::path dir = fs::temp_directory_path() / ("kiln-glm5-mtp-unknown-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(model_dir("glm5_next-mtp-plain") / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  std::string bytes;
  {
    std::ifstream in(model_dir("glm5_next-mtp-plain") / "model.safetensors", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string from = "layers.4.self_attn.q_a_proj.weight", to = "layers.4.self_attn.q_x_proj.weight";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, from.size(), to);
  std::ofstream(dir / "model.safetensors", std::ios::binary) << bytes;

  auto recipe = load_recipe("", {"model.path=" + dir.string(), "model.device=cpu", "kv.layout=fp32"}, global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto plain = load_model(*recipe, global_registry(), {});
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->model->num_mtp_layers(), 0);
  auto with_mtp = load_model(*recipe, global_registry(), {.load_mtp = true});
  ASSERT_FALSE(with_mtp.ok());
  EXPECT_NE(with_mtp.status().message().find("self_attn.q_x_proj.weight"), std::string::npos)
      << with_mtp.status().to_string();
  fs::remove_all(dir);
}

TEST(Glm5NextMtp, ACheckpointWithoutTheLayerLoadsNone) {
  auto recipe = load_recipe("", sets("glm5_next-tiny", "none", 0), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {.load_mtp = true});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->model->num_mtp_layers(), 0);
}

class Glm5NextMtpDrafting : public ::testing::TestWithParam<std::string> {};

TEST_P(Glm5NextMtpDrafting, GreedyOutputIsUnchangedAtDepths1To5) {
  testing::load_mtp_plugin();
  auto recipe = load_recipe("", sets(GetParam(), "mtp", 3), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), model_load_options(*recipe));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_GE(m->model->num_mtp_layers(), 1);
  const std::vector<int32_t> prompt = long_prompt();
  auto plain = testing::engine_generate(*m, sets(GetParam(), "none", 0), prompt, 40);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  int64_t accepted = 0;
  for (int depth = 1; depth <= 5; ++depth) {
    SCOPED_TRACE("depth " + std::to_string(depth));
    EngineMetrics metrics;
    auto drafted = testing::engine_generate(*m, sets(GetParam(), "mtp", depth), prompt, 40, {}, {}, &metrics);
    ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
    EXPECT_EQ(*drafted, *plain);
    EXPECT_GT(metrics.spec_draft_tokens, 0) << "the MTP drafter proposed nothing";
    EXPECT_LT(metrics.spec_accepted_tokens, metrics.spec_draft_tokens) << "no draft was rejected: nothing rolled back";
    accepted += metrics.spec_accepted_tokens;
  }
  // Drafts were also accepted (the fixtures' next-n layers are not all noise), so the accepted path ran too.
  EXPECT_GT(accepted, 0);
  RecordProperty("accepted_drafts", std::to_string(accepted));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Glm5NextMtpDrafting,
                         ::testing::Values("glm5_next-mtp-dsa", "glm5_next-mtp-kda", "glm5_next-mtp-plain"),
                         [](const auto& info) {
                           std::string n = info.param.substr(std::string("glm5_next-mtp-").size());
                           return n;
                         });

// A KDA-kind next-n layer through the draft services as the drafter drives it: target rows in three pieces, each
// followed by draft rows that run through the layer's state and are then dropped. Every target row's logits must
// equal those of one pass over all rows in a sequence of its own (no drafts), so the drafts left no trace.
// glm5_next-mtp-kda's layer 0 has hyper-connections; glm5_next-mtp-plain's layer 1 is plain, beside a DSA layer 0.
class Glm5NextMtpKdaState : public ::testing::TestWithParam<std::pair<std::string, int64_t>> {};

TEST_P(Glm5NextMtpKdaState, FollowsOnlyTheAcceptedRows) {
  const auto [fixture, layer] = GetParam();
  testing::load_mtp_plugin();
  auto recipe = load_recipe("", sets(fixture, "mtp", 3), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto loaded = load_model(*recipe, global_registry(), {.load_mtp = true});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  LoadedModel& m = *loaded;
  ASSERT_GT(m.model->num_mtp_layers(), layer);
  const int64_t trunk = m.info.num_layers, vocab = m.info.vocab_size, hd = m.info.hidden_size;

  CacheManagerConfig cfg;
  cfg.block_size = 16;
  cfg.num_blocks = 32;
  cfg.prefix_caching = false;
  cfg.state_slots = 2;
  cfg.target_layers = trunk;
  auto made = CacheManager::create(m.arch->cache_spec(m.model->num_mtp_layers(), m.layout->indexer_key_format()), m.layout.get(), m.device.get(), cfg);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  CacheManager& caches = **made;
  std::vector<int32_t> ref_table, test_table;
  for (int32_t b = 0; b < 8; ++b) ref_table.push_back(b), test_table.push_back(8 + b);
  auto ref_slot = caches.acquire_state_slot(&ref_table), test_slot = caches.acquire_state_slot(&test_table);
  ASSERT_TRUE(ref_slot.ok() && test_slot.ok());

  const std::vector<int32_t> tokens = long_prompt();
  const int64_t n = static_cast<int64_t>(tokens.size()), rows = n - 1;
  // The trunk's final-normed hidden states over the whole prompt (same for both sequences).
  std::vector<float> hidden;
  for (auto [table, slot] : {std::pair{&ref_table, *ref_slot}, std::pair{&test_table, *test_slot}}) {
    SequenceStep st{tokens, 0, table, false, slot, {}};
    StepOptions options;
    options.tap_layers = {kTapFinalNormed};
    StepOutput out;
    ASSERT_TRUE(m.model->step({&st, 1}, {}, caches.views(), options, out).ok());
    ASSERT_EQ(out.taps.size(), 1u);
    hidden.assign(out.taps[0].as<const float>(), out.taps[0].as<const float>() + n * hd);
  }

  EngineDraftServices services(*m.model, m.format, trunk, "");
  services.attach(&caches, static_cast<int64_t>(caches.views().layers.size()));
  MtpOutput out;
  MtpRows all{ref_table.data(), 8, 0, tokens.data() + 1, hidden.data(), 0, rows, true};
  ASSERT_TRUE(services.mtp_run(layer, {all}, out).ok());
  const std::vector<float> ref(out.logits, out.logits + rows * vocab);

  std::mt19937 rng(11);
  int64_t pos = 0;
  for (int64_t end : {int64_t{40}, int64_t{70}, rows}) {
    MtpRows piece{test_table.data(), 8, pos, tokens.data() + pos + 1, hidden.data() + pos * hd, 0, end - pos, true};
    ASSERT_TRUE(services.mtp_run(layer, {piece}, out).ok());
    for (int64_t r = 0; r < end - pos; ++r)
      for (int64_t v = 0; v < vocab; ++v)
        ASSERT_NEAR(out.logits[r * vocab + v], ref[(pos + r) * vocab + v], 1e-4f) << "row " << pos + r;
    const float* prev = out.hidden + (end - pos - 1) * hd;
    for (int k = 0; k < 3 && end < rows; ++k) {  // drafts on the layer's own output, to be rejected
      const int32_t draft = static_cast<int32_t>(rng() % vocab);
      MtpRows d{test_table.data(), 8, end + k, &draft, prev, 0, 1, false};
      ASSERT_TRUE(services.mtp_run(layer, {d}, out).ok());
      prev = out.hidden;
    }
    pos = end;
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, Glm5NextMtpKdaState,
                         ::testing::Values(std::pair<std::string, int64_t>{"glm5_next-mtp-kda", 0},
                                           std::pair<std::string, int64_t>{"glm5_next-mtp-plain", 1}),
                         [](const auto& info) {
                           return info.param.first.substr(std::string("glm5_next-mtp-").size()) + "_layer" +
                                  std::to_string(info.param.second);
                         });

}  // namespace
}  // namespace kiln
