// glm5_next's config.json as transformers 5.17 reads it: defaults, the nested and flat forms, the legacy keys, and
// refusals that name the file and the field; and a checkpoint missing a tensor refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/glm5_next_test_model.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/safetensors_file.h"
#include "safetensors_writer.h"

namespace kiln {
namespace {
using glm5_next::AttentionKind;
using glm5_next::Glm5NextConfig;
using nlohmann::json;
namespace fs = std::filesystem;

Result<Glm5NextConfig> parse(const json& j) {
  return Glm5NextConfig::from_json(j, "cfg/config.json");
}

json fixture_config(const std::string& name) {
  std::ifstream in(testing::model_dir(name) / "config.json");
  return json::parse(in);
}

TEST(Glm5NextConfig, DefaultsAreGlm53Flash) {
  auto c = parse(json{{"model_type", "glm5_next"}});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->num_hidden_layers, 45);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->attention.size(), 45u);
  int dsa = 0;
  for (int64_t i = 0; i < 45; ++i) {
    EXPECT_EQ(c->is_kda(i), i % 4 != 3) << i;
    dsa += !c->is_kda(i);
    EXPECT_EQ(c->moe[i], i >= 3) << i;
    EXPECT_FALSE(c->shared_indexer[i]) << i;
  }
  EXPECT_EQ(dsa, 11);
  ASSERT_TRUE(c->linear_lower_bound.has_value());
  EXPECT_EQ(*c->linear_lower_bound, -5.0);
  EXPECT_EQ(c->selection_width(), 2048 + 15);
  EXPECT_EQ(c->kda_recurrent_bytes(), 64u * 128 * 128 * 4);  // 4 MiB
  EXPECT_EQ(c->kda_conv_bytes(), 3u * 3 * 8192 * 4);
}

TEST(Glm5NextConfig, ReadsTheNestedTextConfig) {
  auto c = parse(fixture_config("glm5_next-shared"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->hc_mult, 2);
  EXPECT_FALSE(c->linear_lower_bound.has_value());  // null: the legacy softplus decay
  EXPECT_EQ(c->attention[4], AttentionKind::kDsa);  // "full_attention", the alias
  EXPECT_TRUE(c->shared_indexer[2]);
  EXPECT_FALSE(c->runs_indexer(2));
  EXPECT_TRUE(c->runs_indexer(1));
}

TEST(Glm5NextConfig, EosFromEitherLevelOfANestedConfig) {
  json j = fixture_config("glm5_next-tiny");
  j["eos_token_id"] = {500, 501};
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{500, 501}));
  j["text_config"]["eos_token_id"] = 502;
  c = parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{502}));
}

TEST(Glm5NextConfig, ReadsTheLegacyKeysAsTransformersDoes) {
  auto c = parse(fixture_config("glm5_next-flat"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->linear_num_heads, 3);
  EXPECT_EQ(c->linear_head_dim, 16);
  EXPECT_EQ(c->linear_conv_kernel_dim, 3);
  ASSERT_TRUE(c->linear_lower_bound.has_value());  // gate_lower_bound null + safe_gate → −5
  EXPECT_EQ(*c->linear_lower_bound, -5.0);
  // index_topk_freq 2, index_skip_topk_offset 2: layer 2 (DSA after the full DSA layer 1) shares.
  EXPECT_EQ(c->shared_indexer, (std::vector<bool>{false, false, true, false, false, false}));

  json j = fixture_config("glm5_next-flat");
  j["linear_attn_config"]["safe_gate"] = false;
  c = parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->linear_lower_bound.has_value());

  j = fixture_config("glm5_next-flat");
  j.erase("index_topk_freq");
  j["index_topk_pattern"] = "FFSFFF";
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->shared_indexer[2]);
  EXPECT_FALSE(c->shared_indexer[4]);
}

void expect_refused(const json& j, const std::string& field, const std::string& why) {
  auto c = parse(j);
  ASSERT_FALSE(c.ok()) << field;
  EXPECT_NE(c.status().message().find("cfg/config.json"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("'" + field + "'"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
}

TEST(Glm5NextConfig, RefusalsNameTheFileAndField) {
  json j = fixture_config("glm5_next-tiny");
  j["text_config"]["qk_rope_head_dim"] = 64;
  expect_refused(j, "text_config.qk_rope_head_dim", "must be 0");

  j = fixture_config("glm5_next-shared");
  j["text_config"]["indexer_types"] = {"full", "shared", "shared", "full", "full", "full"};
  j["text_config"]["layer_types"] = {"linear_attention", "linear_attention",          "deepseek_sparse_attention",
                                     "linear_attention", "deepseek_sparse_attention", "linear_attention"};
  expect_refused(j, "text_config.indexer_types[2]", "linear_attention (KDA)");

  j = fixture_config("glm5_next-shared");
  j["text_config"]["layer_types"][3] = "sliding_attention";
  expect_refused(j, "text_config.layer_types", "\"sliding_attention\"");

  j = fixture_config("glm5_next-flat");
  j["layer_types"].push_back("linear_attention");
  expect_refused(j, "layer_types", "7 entries");

  j = fixture_config("glm5_next-flat");
  j["index_topk"] = 10;
  expect_refused(j, "index_topk", "multiple of index_kpool");
}

TEST(Glm5NextConfig, CacheSpecHoldsStateForKdaAndPagesForDsa) {
  auto arch = parse_architecture(fixture_config("glm5_next-shared"), "cfg/config.json");
  ASSERT_TRUE(arch.ok()) << arch.status().to_string();
  const CacheSpec spec = (*arch)->cache_spec(0, IndexerKeyFormat::kFp32);
  ASSERT_EQ(spec.layers.size(), 6u);
  // KDA layers 0, 3, 5: recurrent [4, 8, 8] + conv [3, 3·32] fp32 per sequence.
  EXPECT_EQ(spec.bytes_per_sequence(), 3u * (4 * 8 * 8 + 3 * 96) * 4);
  // DSA layers 1, 2, 4: the latent in the layout; 1 and 4 run their indexer ([k | gate] of 32 each, fp32, and a
  // 32-float pool key per 16 tokens).
  EXPECT_EQ(spec.bytes_per_token(64), 3u * 64 + 2u * (64 * 4 + 32 * 4 / 16));
  EXPECT_EQ(spec.layers[2].entries.size(), 1u);
  EXPECT_EQ((*arch)->info().qk_rope_head_dim, 0);
  EXPECT_FALSE((*arch)->supports(DeviceType::kCuda).ok());
  // Ranks with pools of their own keep their heads' part: 4 heads over 2 ranks 2 each, over 3 ranks at most 2
  // (2 + 1 + 1), over 4 ranks 1; the pages are unchanged.
  for (const auto& [shares, heads] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{4, 1}}) {
    const CacheSpec part = (*arch)->cache_spec(0, IndexerKeyFormat::kFp32, shares);
    EXPECT_EQ(part.bytes_per_sequence(), 3u * (heads * 8 * 8 + 3 * 3 * heads * 8) * 4) << shares << " shares";
    EXPECT_EQ(part.bytes_per_token(64), spec.bytes_per_token(64));
  }
}

// A copy of a fixture in `dir` whose checkpoint lacks one tensor.
void copy_without_tensor(const std::string& fixture, const std::string& dropped, const fs::path& dir) {
  fs::copy_file(testing::model_dir(fixture) / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  auto file = SafetensorsFile::open(testing::model_dir(fixture) / "model.safetensors");
  ASSERT_TRUE(file.ok());
  std::vector<testing::TensorSpec> specs;
  for (const std::string& name : file->names()) {
    if (name == dropped) continue;
    auto t = file->get(name);
    ASSERT_TRUE(t.ok());
    testing::TensorSpec s{name, "F32", {}, std::string(static_cast<const char*>(t->data), t->nbytes())};
    for (int i = 0; i < t->rank; ++i) s.shape.push_back(t->shape[i]);
    specs.push_back(std::move(s));
  }
  testing::write_file(dir / "model.safetensors", testing::build_safetensors(specs));
}

TEST(Glm5NextWeights, MissingTensorIsNamed) {
  for (const auto& [fixture, dropped] :
       {std::pair<std::string, std::string>{"glm5_next-tiny",
                                            "model.language_model.layers.3.self_attn.indexer.wk.weight"},
        {"glm5_next-flat", "model.layers.0.hc_ffn_base"}}) {
    testing::ScratchDir dir;
    copy_without_tensor(fixture, dropped, dir.path());
    auto recipe =
        load_recipe("", {"model.path=" + dir.path().string(), "model.device=cpu", "kv.layout=fp32"}, global_registry());
    ASSERT_TRUE(recipe.ok());
    auto m = load_model(*recipe, global_registry());
    ASSERT_FALSE(m.ok()) << dropped;
    EXPECT_NE(m.status().message().find(dropped), std::string::npos) << m.status().message();
  }
}

}  // namespace
}  // namespace kiln
