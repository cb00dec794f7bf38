#include "model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/rope_setup.h"
#include "model/safetensors_writer.h"

namespace kiln {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(KILN_SOURCE_DIR) / "tests" / "data" / "configs" / name;
}

ModelConfig load_fixture(const std::string& name) {
  Result<ModelConfig> c = ModelConfig::load(fixture(name));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : ModelConfig{};
}

// Parses `j` as "test.json" and returns the error message (checked to name the file).
std::string config_error(const json& j, StatusCode code = StatusCode::kInvalidArgument) {
  Result<ModelConfig> r = ModelConfig::from_json(j, "test.json");
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_THAT(r.status().message(), HasSubstr("test.json"));
  return r.status().message();
}

// The frequencies the kernels rope with, derived from the parsed config (the path the model takes).
std::vector<float> kernel_inv_freq(const ModelConfig& c) { return cpu::rope_inv_freq(kernel_rope_config(c)); }

ModelConfig parse(const json& j) {
  Result<ModelConfig> c = ModelConfig::from_json(j, "test.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : ModelConfig{};
}

TEST(ModelConfig, Glm47Flash) {
  const ModelConfig c = load_fixture("glm-4.7-flash.json");
  EXPECT_EQ(c.model_type, "glm4_moe_lite");
  EXPECT_THAT(c.source, HasSubstr("glm-4.7-flash.json"));
  EXPECT_EQ(c.vocab_size, 154880);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 10240);
  EXPECT_EQ(c.moe_intermediate_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 47);
  EXPECT_EQ(c.num_attention_heads, 20);
  EXPECT_EQ(c.q_lora_rank, 768);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 192);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.8);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 202752);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_TRUE(c.rope.interleave);
  EXPECT_FALSE(c.is_moe(0));
  EXPECT_TRUE(c.is_moe(1));
  EXPECT_TRUE(c.is_moe(46));
  EXPECT_TRUE(c.is_moe(47));  // the MTP layer
  EXPECT_FALSE(c.is_moe(48));
  EXPECT_EQ(c.bos_token_id, 0);  // absent: the class default
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{154820, 154827, 154829}));
  EXPECT_EQ(c.pad_token_id, 154820);
  EXPECT_FALSE(c.has_indexer());
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / 16);  // (192 + 64)^-0.5
}

TEST(ModelConfig, Glm5) {
  const ModelConfig c = load_fixture("glm-5.json");
  EXPECT_EQ(c.model_type, "glm_moe_dsa");
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_hidden_layers, 78);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.q_lora_rank, 2048);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_TRUE(c.has_indexer());
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_TRUE(c.rope.interleave);
  for (int64_t layer = 0; layer < 3; ++layer) EXPECT_FALSE(c.is_moe(layer)) << layer;
  EXPECT_TRUE(c.is_moe(3));
  EXPECT_TRUE(c.is_moe(77));
  EXPECT_TRUE(c.is_moe(78));
  for (int64_t layer = 0; layer < 78; ++layer) EXPECT_FALSE(c.indexer_is_shared(layer)) << layer;

  const ModelInfo info = c.to_model_info();
  EXPECT_EQ(info.model_type, "glm_moe_dsa");
  EXPECT_EQ(info.vocab_size, 154880);
  EXPECT_EQ(info.hidden_size, 6144);
  EXPECT_EQ(info.num_layers, 78);
  EXPECT_EQ(info.num_mtp_layers, 1);
  EXPECT_EQ(info.num_heads, 64);
  EXPECT_EQ(info.q_lora_rank, 2048);
  EXPECT_EQ(info.kv_lora_rank, 512);
  EXPECT_EQ(info.qk_nope_head_dim, 192);
  EXPECT_EQ(info.qk_rope_head_dim, 64);
  EXPECT_EQ(info.v_head_dim, 256);
  EXPECT_EQ(info.num_experts, 256);
  EXPECT_EQ(info.experts_per_token, 8);
  EXPECT_EQ(info.moe_intermediate_size, 2048);
  EXPECT_EQ(info.index_head_dim, 128);
  EXPECT_EQ(info.max_position_embeddings, 202752);
}

TEST(ModelConfig, DeepseekV3WithYarn) {
  const ModelConfig c = load_fixture("deepseek-v3.json");
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_FALSE(c.is_moe(2));
  EXPECT_TRUE(c.is_moe(3));
  EXPECT_EQ(c.to_model_info().index_head_dim, 0);

  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1);
  EXPECT_DOUBLE_EQ(c.rope.mscale, 1);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 1.0);
  // transformers: yarn_apply_mscale(rope_parameters, 192 ** -0.5)
  EXPECT_NEAR(c.attention_scale(), 0.1352337788608801, 1e-15);

  // transformers' _compute_yarn_parameters for this config (float32), pairs 0, 5, 10, 15, 16, 20, 25, 31.
  const std::vector<float> inv = kernel_inv_freq(c);
  ASSERT_EQ(inv.size(), 32u);
  const std::vector<std::pair<int, double>> expected = {{0, 1.0},
                                                        {5, 0.23713736236095428},
                                                        {10, 0.05623412877321243},
                                                        {15, 0.0083345090970397},
                                                        {16, 0.005500000435858965},
                                                        {20, 0.0007905694073997438},
                                                        {25, 1.8747354260995053e-05},
                                                        {31, 3.3338035336782923e-06}};
  for (const auto& [i, want] : expected) EXPECT_NEAR(inv[i], want, want * 1e-6) << "pair " << i;
}

TEST(ModelConfig, YarnWithNullFactorAndNoTruncation) {
  // transformers: factor=None → max_position / original; attention_factor = 0.1·ln(4) + 1.
  const ModelConfig c = parse({{"model_type", "deepseek_v3"},
                               {"qk_rope_head_dim", 16},
                               {"max_position_embeddings", 1024},
                               {"rope_parameters",
                                {{"rope_type", "yarn"},
                                 {"factor", nullptr},
                                 {"original_max_position_embeddings", 256},
                                 {"truncate", false},
                                 {"rope_theta", 500.0}}}});
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_FALSE(c.rope.truncate);
  EXPECT_NEAR(c.rope.attention_factor, 1.138629436111989, 1e-12);
  const std::vector<double> expected = {1.0,
                                        0.40659600496292114,
                                        0.1514279544353485,
                                        0.053287748247385025,
                                        0.016987040638923645,
                                        0.005141428206115961,
                                        0.0023643539752811193,
                                        0.0010872796410694718};
  const std::vector<float> inv = kernel_inv_freq(c);
  ASSERT_EQ(inv.size(), expected.size());
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR(inv[i], expected[i], expected[i] * 1e-6) << i;
  // No mscale_all_dim: the softmax scale stays qk_head_dim^-0.5.
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / std::sqrt(128.0 + 16.0));
}

TEST(ModelConfig, RopeScalingAndRopeParametersAgree) {
  json legacy = json::parse(R"({"model_type": "deepseek_v3", "max_position_embeddings": 163840, "rope_theta": 10000,
      "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                       "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})");
  json saved = json::parse(R"({"model_type": "deepseek_v3", "max_position_embeddings": 163840,
      "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                          "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0}})");
  const ModelConfig a = parse(legacy);
  const ModelConfig b = parse(saved);
  EXPECT_EQ(a.rope.type, RopeType::kYarn);
  EXPECT_TRUE(a.rope == b.rope);
  EXPECT_EQ(kernel_inv_freq(a), kernel_inv_freq(b));
  EXPECT_DOUBLE_EQ(a.attention_scale(), b.attention_scale());

  json glm_legacy = {{"model_type", "glm4_moe_lite"}, {"rope_theta", 1000000}};
  json glm_saved = {{"model_type", "glm4_moe_lite"},
                    {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}}};
  EXPECT_TRUE(parse(glm_legacy).rope == parse(glm_saved).rope);
  EXPECT_DOUBLE_EQ(parse(glm_saved).rope.theta, 1e6);
}

// linear, llama3 and dynamic as transformers 5.17 reads them (tests/kernels/rope_test.cpp checks the tables bit for bit).
TEST(ModelConfig, LinearLlama3AndDynamicRope) {
  const ModelConfig linear = parse({{"model_type", "glm4_moe_lite"},
                                    {"rope_scaling", {{"type", "linear"}, {"factor", 4}, {"mscale_all_dim", 0.5}}}});
  EXPECT_EQ(linear.rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(linear.rope.factor, 4);
  EXPECT_DOUBLE_EQ(linear.rope.attention_factor, 1.0);  // cos/sin unscaled: only YaRN scales them
  // yarn_apply_mscale: every rope type but default scales the softmax by m².
  const double m = 0.1 * 0.5 * std::log(4.0) + 1.0;
  EXPECT_NEAR(linear.attention_scale(), m * m / std::sqrt(static_cast<double>(linear.qk_head_dim())), 1e-15);
  const ModelConfig plain = parse({{"model_type", "glm4_moe_lite"}});
  const std::vector<float> base = kernel_inv_freq(plain), scaled = kernel_inv_freq(linear);
  ASSERT_EQ(base.size(), scaled.size());
  for (size_t i = 0; i < base.size(); ++i) EXPECT_EQ(scaled[i], base[i] / 4.0f) << i;

  const ModelConfig llama3 = parse({{"model_type", "deepseek_v3"},
                                    {"max_position_embeddings", 65536},
                                    {"rope_parameters",
                                     {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                                      {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                      {"original_max_position_embeddings", 8192}}}});
  EXPECT_EQ(llama3.rope.type, RopeType::kLlama3);
  EXPECT_EQ(llama3.rope.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(llama3.rope.high_freq_factor, 4.0);
  EXPECT_DOUBLE_EQ(llama3.attention_scale(), 1.0 / std::sqrt(static_cast<double>(llama3.qk_head_dim())));
  // original_max_position_embeddings falls back to max_position_embeddings, as for yarn.
  const ModelConfig llama3_implied =
      parse({{"model_type", "deepseek_v3"}, {"max_position_embeddings", 4096},
             {"rope_scaling", {{"type", "llama3"}, {"factor", 8}, {"low_freq_factor", 1}, {"high_freq_factor", 4}}}});
  EXPECT_EQ(llama3_implied.rope.original_max_position_embeddings, 4096);

  // Dynamic NTK only rescales past max_position_embeddings, where kiln refuses positions: the default table.
  const ModelConfig dynamic =
      parse({{"model_type", "glm_moe_dsa"}, {"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2.0}}}});
  EXPECT_EQ(dynamic.rope.type, RopeType::kDynamic);
  EXPECT_EQ(kernel_inv_freq(dynamic), kernel_inv_freq(parse({{"model_type", "glm_moe_dsa"}})));

  // What transformers cannot build is refused naming the field.
  for (const char* type : {"linear", "llama3", "dynamic"}) {
    EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"rope_scaling", {{"type", type}}}}),
                HasSubstr(std::string(type) + " rope needs field 'rope_scaling.factor'"));
    EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"rope_scaling", {{"type", type}, {"factor", nullptr}}}}),
                HasSubstr("field 'rope_scaling.factor' must be a number"));
    EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"rope_scaling", {{"type", type}, {"factor", 0}}}}),
                HasSubstr("field 'rope_scaling.factor' must be positive"));
  }
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"},
                            {"rope_scaling", {{"type", "llama3"}, {"factor", 8}, {"low_freq_factor", 1}}}}),
              HasSubstr("llama3 rope needs field 'rope_scaling.high_freq_factor'"));
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"},
                            {"rope_scaling",
                             {{"type", "llama3"}, {"factor", 8}, {"low_freq_factor", 2}, {"high_freq_factor", 2}}}}),
              HasSubstr("field 'rope_scaling.high_freq_factor' must exceed low_freq_factor (2.0)"));
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"},
                            {"rope_scaling", {{"type", "linear"}, {"factor", 2}, {"partial_rotary_factor", 0.5}}}},
                           StatusCode::kUnimplemented),
              HasSubstr("'rope_scaling.partial_rotary_factor' is 0.5; deepseek_v3's linear rope reads it"));
}

TEST(ModelConfig, RopePrecedenceFollowsTransformers) {
  // A non-empty rope_scaling wins over rope_parameters; a theta inside the dict wins over the top level;
  // rope_type wins over the legacy "type".
  const ModelConfig c = parse({{"model_type", "glm_moe_dsa"},
                               {"rope_theta", 5.0},
                               {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 7.0}}},
                               {"rope_scaling", {{"type", "linear"}, {"rope_type", "default"}, {"rope_theta", 9.0}}}});
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope.theta, 9.0);
  // No rope keys at all: the default base.
  EXPECT_DOUBLE_EQ(parse({{"model_type", "glm_moe_dsa"}}).rope.theta, 10000.0);
  // A top-level original_max_position_embeddings overrides the dict's.
  const ModelConfig yarn =
      parse({{"model_type", "deepseek_v3"},
             {"original_max_position_embeddings", 2048},
             {"rope_scaling", {{"type", "yarn"}, {"factor", 2}, {"original_max_position_embeddings", 4096}}}});
  EXPECT_EQ(yarn.rope.original_max_position_embeddings, 2048);
  EXPECT_NEAR(yarn.rope.attention_factor, 0.1 * std::log(2.0) + 1.0, 1e-15);
}

TEST(ModelConfig, MissingKeysTakeEachClassDefault) {
  const ModelConfig lite = parse({{"model_type", "glm4_moe_lite"}});
  EXPECT_EQ(lite.num_hidden_layers, 47);
  EXPECT_EQ(lite.n_routed_experts, 64);
  EXPECT_DOUBLE_EQ(lite.routed_scaling_factor, 1.8);
  EXPECT_EQ(lite.num_nextn_predict_layers, 0);
  EXPECT_FALSE(lite.is_moe(0));
  EXPECT_TRUE(lite.is_moe(1));

  const ModelConfig dsa = parse({{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 5}});
  EXPECT_EQ(dsa.hidden_size, 6144);
  EXPECT_EQ(dsa.index_n_heads, 32);
  EXPECT_FALSE(dsa.is_moe(2));
  EXPECT_TRUE(dsa.is_moe(3));

  const ModelConfig ds =
      parse({{"model_type", "deepseek_v3"}, {"num_key_value_heads", nullptr}, {"q_lora_rank", nullptr}});
  EXPECT_EQ(ds.max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(ds.rms_norm_eps, 1e-6);
  EXPECT_EQ(ds.num_nextn_predict_layers, 1);  // num_mtp_layers defaults to 1
  EXPECT_EQ(ds.num_key_value_heads, 128);
  EXPECT_EQ(ds.q_lora_rank, 0);
  EXPECT_EQ(ds.n_group, 8);
  EXPECT_EQ(ds.eos_token_ids, std::vector<int64_t>{1});
}

TEST(ModelConfig, MlpLayerTypesAndAliases) {
  const ModelConfig lite = parse({{"model_type", "glm4_moe_lite"},
                                  {"num_hidden_layers", 3},
                                  {"mlp_layer_types", {"dense", "sparse", "dense"}},
                                  {"num_local_experts", 8}});
  EXPECT_FALSE(lite.is_moe(0));
  EXPECT_TRUE(lite.is_moe(1));
  EXPECT_FALSE(lite.is_moe(2));
  EXPECT_EQ(lite.n_routed_experts, 8);

  // deepseek_v3 ignores mlp_layer_types and reads first_k_dense_replace.
  const ModelConfig ds = parse({{"model_type", "deepseek_v3"},
                                {"num_hidden_layers", 4},
                                {"first_k_dense_replace", 1},
                                {"mlp_layer_types", {"dense", "dense", "dense", "dense"}},
                                {"num_mtp_layers", 0}});
  EXPECT_FALSE(ds.is_moe(0));
  EXPECT_TRUE(ds.is_moe(1));
  EXPECT_FALSE(ds.is_moe(4));  // no MTP layer
  EXPECT_EQ(ds.num_nextn_predict_layers, 0);

  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"num_hidden_layers", 4}, {"first_k_dense_replace", 2}}),
              HasSubstr("'first_k_dense_replace'"));
  EXPECT_THAT(config_error({{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 2}, {"mlp_layer_types", {"dense"}}}),
              HasSubstr("'mlp_layer_types' has 1 entries but num_hidden_layers is 2"));
  EXPECT_THAT(config_error({{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 1}, {"mlp_layer_types", {"moe"}}}),
              HasSubstr("'mlp_layer_types' must be a list of strings from {dense, sparse}"));
}

TEST(ModelConfig, IndexerLayerSchedule) {
  // transformers: GlmMoeDsaConfig(num_hidden_layers=8, index_topk_freq=2).indexer_types
  const ModelConfig freq = parse({{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 8}, {"index_topk_freq", 2}});
  const std::vector<bool> want = {false, false, true, false, true, false, true, false};
  EXPECT_EQ(freq.indexer_shared_layers, want);

  const ModelConfig pattern =
      parse({{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 4}, {"index_topk_pattern", "FSSF"}});
  EXPECT_EQ(pattern.indexer_shared_layers, (std::vector<bool>{false, true, true, false}));
  EXPECT_TRUE(pattern.indexer_is_shared(1));

  const ModelConfig types =
      parse({{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 2}, {"indexer_types", {"full", "shared"}}});
  EXPECT_EQ(types.indexer_shared_layers, (std::vector<bool>{false, true}));

  EXPECT_THAT(config_error({{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 2}, {"index_topk_pattern", "SF"}}),
              HasSubstr("'index_topk_pattern'"));
}

TEST(ModelConfig, WrongTypesNameFileAndField) {
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"hidden_size", "64"}}),
              HasSubstr("field 'hidden_size' must be an integer, got string \"64\""));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"hidden_size", 64.5}}), HasSubstr("'hidden_size'"));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"rms_norm_eps", "1e-5"}}),
              HasSubstr("field 'rms_norm_eps' must be a number"));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"norm_topk_prob", 1}}),
              HasSubstr("field 'norm_topk_prob' must be true or false"));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"eos_token_id", "</s>"}}),
              HasSubstr("field 'eos_token_id'"));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"bos_token_id", {1, 2}}}),
              HasSubstr("field 'bos_token_id'"));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"num_key_value_heads", nullptr}}),
              HasSubstr("field 'num_key_value_heads'"));
  EXPECT_THAT(config_error(
                  {{"model_type", "deepseek_v3"},
                   {"rope_scaling", {{"type", "yarn"}, {"factor", "40"}, {"original_max_position_embeddings", 4096}}}}),
              HasSubstr("field 'rope_scaling.factor' must be a number"));
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"rope_parameters", "yarn"}}),
              HasSubstr("field 'rope_parameters' must be an object or null"));
  EXPECT_THAT(config_error({{"model_type", 3}}), HasSubstr("field 'model_type' must be a string"));
}

TEST(ModelConfig, RejectsValuesTheRuntimeCannotServe) {
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"},
                            {"rope_scaling", {{"type", "longrope"}, {"short_factor", {1}}, {"long_factor", {2}}}}},
                           StatusCode::kUnimplemented),
              HasSubstr("'rope_scaling.rope_type' is 'longrope'; kiln supports \"default\", \"yarn\", \"linear\""));
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"rope_scaling", {{"type", "ntk"}, {"factor", 2}}}},
                           StatusCode::kUnimplemented),
              HasSubstr("'rope_scaling.rope_type' is 'ntk'"));
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"rope_scaling", {{"type", "yarn"}}}}),
              HasSubstr("'rope_scaling.factor'"));
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"scoring_func", "softmax"}}, StatusCode::kUnimplemented),
              HasSubstr("'scoring_func' is 'softmax'"));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"num_experts_per_tok", 100}}),
              HasSubstr("'num_experts_per_tok' (100) exceeds n_routed_experts (64)"));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"hidden_size", 0}}),
              HasSubstr("'hidden_size' must be ≥ 1"));
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"n_group", 3}}), HasSubstr("'n_group' (3) must divide"));
  EXPECT_THAT(config_error({{"model_type", "glm_moe_dsa"}, {"mlp_bias", true}}, StatusCode::kUnimplemented),
              HasSubstr("'mlp_bias'"));
}

// Options transformers honours (or cannot run) that kiln's MLA + MoE path would otherwise compute differently: each
// is refused naming config.json's field, never run as another model.
TEST(ModelConfig, RefusesOptionsItWouldComputeDifferently) {
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"attention_bias", true}}, StatusCode::kUnimplemented),
              HasSubstr("'attention_bias' is true"));
  EXPECT_TRUE(ModelConfig::from_json({{"model_type", "deepseek_v3"}, {"attention_bias", false}}, "test.json").ok());
  // glm4_moe_lite's default rope reads partial_rotary_factor, at the top level or in the rope dict.
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"}, {"partial_rotary_factor", 0.5}}, StatusCode::kUnimplemented),
              HasSubstr("field 'partial_rotary_factor' is 0.5"));
  EXPECT_THAT(config_error({{"model_type", "glm4_moe_lite"},
                            {"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}}}},
                           StatusCode::kUnimplemented),
              HasSubstr("field 'rope_parameters.partial_rotary_factor' is 0.25"));
  // Every class's yarn reads it.
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"},
                            {"rope_scaling", {{"type", "yarn"}, {"factor", 4}, {"partial_rotary_factor", 0.5}}}},
                           StatusCode::kUnimplemented),
              HasSubstr("'rope_scaling.partial_rotary_factor' is 0.5; deepseek_v3's yarn rope reads it"));
  // deepseek_v3's and glm_moe_dsa's default rope ignore it (all qk_rope_head_dim dims rotate), and so does kiln.
  for (const char* type : {"deepseek_v3", "glm_moe_dsa"}) {
    const ModelConfig c = parse({{"model_type", type}, {"rope_parameters", {{"rope_type", "default"},
                                                                             {"partial_rotary_factor", 0.5}}}});
    EXPECT_EQ(kernel_rope_config(c).rotary_dim, c.qk_rope_head_dim) << type;
  }
  EXPECT_TRUE(ModelConfig::from_json({{"model_type", "glm4_moe_lite"}, {"partial_rotary_factor", 1.0}}, "t").ok());
  // Group scores sum each group's two best experts; top-k cannot reach beyond the kept groups.
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"n_routed_experts", 8}, {"n_group", 8}, {"topk_group", 4},
                            {"num_experts_per_tok", 2}}),
              HasSubstr("'n_group' (8) leaves 1 expert per group"));
  EXPECT_THAT(config_error({{"model_type", "deepseek_v3"}, {"n_routed_experts", 8}, {"n_group", 4}, {"topk_group", 1},
                            {"num_experts_per_tok", 3}}),
              HasSubstr("'num_experts_per_tok' (3) exceeds the 2 experts of the topk_group kept groups"));
  // A stack without MoE layers never routes: the class's n_group default (8) may stay with 8 experts.
  EXPECT_TRUE(ModelConfig::from_json({{"model_type", "deepseek_v3"}, {"n_routed_experts", 8}, {"num_hidden_layers", 3},
                                      {"first_k_dense_replace", 5}, {"num_mtp_layers", 0}}, "t").ok());
  // One group of one expert is fine: the group choice is trivial.
  EXPECT_TRUE(ModelConfig::from_json({{"model_type", "glm4_moe_lite"}, {"n_routed_experts", 1}, {"n_group", 1},
                                      {"num_experts_per_tok", 1}}, "t").ok());
}

// The architecture registry answers for model types it does not hold, naming the ones it does.
TEST(ModelConfig, UnsupportedModelTypes) {
  for (const char* type : {"llama", "deepseek_v32"}) {
    const std::string msg = config_error({{"model_type", type}}, StatusCode::kUnimplemented);
    EXPECT_THAT(msg, HasSubstr(std::string("model_type '") + type + "' is not supported"));
    EXPECT_THAT(msg, HasSubstr("deepseek_v3, glm4_moe_lite, glm_moe_dsa, glm5_next"));
  }
  // glm5_next is an architecture of its own (model/arch/glm5_next), not a member of the MLA + MoE family.
  EXPECT_THAT(config_error({{"model_type", "glm5_next"}}, StatusCode::kUnimplemented),
              HasSubstr("'glm5_next' is not an MLA + MoE model"));
  EXPECT_THAT(config_error(json::object()), HasSubstr("no 'model_type'"));
  EXPECT_THAT(config_error({{"model_type", 7}}), HasSubstr("'model_type' must be a string"));
}

TEST(ModelConfig, LoadErrorsNameThePath) {
  Result<ModelConfig> missing = ModelConfig::load("/nonexistent/kiln/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/kiln/config.json"));

  testing::ScratchDir dir;
  testing::write_file(dir / "config.json", "{\"model_type\": ");
  Result<ModelConfig> broken = ModelConfig::load(dir / "config.json");
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr("config.json: not valid JSON"));
}

}  // namespace
}  // namespace kiln
