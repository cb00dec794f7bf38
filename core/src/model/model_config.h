// The config of the MLA + MoE family (glm4_moe_lite, glm_moe_dsa, deepseek_v3), read from config.json the way
// transformers 5.17 reads it: every field the runtime uses, with each architecture's class default when the key is
// missing, legacy aliases honoured, and the rope settings resolved from either `rope_scaling` (published
// checkpoints) or `rope_parameters` (saved by transformers ≥ 5). Values are checked for type and basic sanity;
// errors name the file and the field. What differs between the family's classes is an MlaMoeVariant, which each
// architecture's folder (model/arch/<name>/) provides.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kiln/model_info.h"
#include "kiln/status.h"

namespace kiln {

// transformers' rope_type values kiln runs. kDynamic (dynamic NTK) rescales only for sequences longer than
// max_position_embeddings, which kiln refuses, so within kiln's range it is the default table.
enum class RopeType { kDefault, kYarn, kLinear, kLlama3, kDynamic };

// The config.json spelling of a rope type ("default", "yarn", ...).
const char* rope_type_name(RopeType type);

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // fraction of qk_rope_head_dim that rotates
  bool interleave = true;              // pairs (x[2i], x[2i+1]) rather than halves (x[i], x[i + d/2])
  // Every type but default: factor (YaRN: null in the JSON → max_position / original_max_position).
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // YaRN and llama3; missing → max_position_embeddings
  double low_freq_factor = 1.0;                  // llama3 only
  double high_freq_factor = 4.0;                 // llama3 only
  double mscale_all_dim = 0.0;  // every type but default (yarn_apply_mscale reads it for all): 0 = not given
  // YaRN only (defaults as transformers' _compute_yarn_parameters applies them).
  double beta_fast = 32.0;                       // missing or 0 → 32
  double beta_slow = 1.0;                        // missing or 0 → 1
  double mscale = 0.0;                           // 0 = not given
  bool truncate = true;
  // cos/sin multiplier: the JSON's attention_factor, else derived from factor, mscale and mscale_all_dim.
  double attention_factor = 1.0;

  bool operator==(const RopeConfig&) const = default;
};

struct ModelConfig;

// How one transformers class of the family reads its config: its class defaults and the rules where the classes
// differ.
struct MlaMoeVariant {
  const char* model_type = "";
  ModelConfig (*defaults)() = nullptr;
  // Which MoE layers are dense. kFirstKDense: the first first_k_dense_replace layers (default
  // default_first_k_dense) unless mlp_layer_types lists them. kFirstKDenseOnly: the same, ignoring mlp_layer_types.
  // kLayerZero: layer 0 only unless mlp_layer_types lists them (a first_k_dense_replace other than 1 is refused).
  enum class DenseLayers { kFirstKDense, kFirstKDenseOnly, kLayerZero } dense_layers = DenseLayers::kFirstKDense;
  int64_t default_first_k_dense = 3;
  bool null_kv_heads_means_heads = false;   // num_key_value_heads: null = num_attention_heads
  bool head_dim_aliases_rope_dim = false;   // `head_dim` is an alias of qk_rope_head_dim
  bool num_experts_alias = false;           // `num_experts` is an alias of n_routed_experts (besides num_local_experts)
  bool num_mtp_layers_alias = false;        // `num_mtp_layers` is an alias of num_nextn_predict_layers
  bool reads_rope_interleave = true;        // false: always interleaved, no switch
  // Whether the class's default rope reads partial_rotary_factor (yarn always does). Where it is read, a factor
  // other than 1 builds a table narrower than qk_rope_head_dim, which transformers' MLA cannot apply.
  bool default_rope_reads_partial_rotary = false;
  bool has_indexer = false;                 // the DSA lightning indexer (index_*, indexer layer schedule, mlp_bias)
};

struct ModelConfig {
  std::string model_type;  // "glm4_moe_lite" | "glm_moe_dsa" | "deepseek_v3"
  std::string source;      // where it was read from, for messages

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // each routed / shared expert
  int64_t num_hidden_layers = 0;      // target layers, excluding next-n (MTP) layers
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t q_lora_rank = 0;  // 0 (null in the JSON) = queries are projected directly, no q_a/q_b
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 0;
  int64_t topk_group = 0;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  std::string scoring_func = "sigmoid";  // only sigmoid is accepted: the family's gate
  std::string topk_method = "noaux_tc";  // only noaux_tc is accepted: bias-corrected group top-k
  std::string hidden_act = "silu";       // only silu is accepted
  // Per target layer: true = MoE block, false = dense MLP (from mlp_layer_types or first_k_dense_replace).
  std::vector<bool> moe_layers;

  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored after the target layers

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // an int or a list in the JSON
  std::optional<int64_t> pad_token_id;

  // DSA lightning indexer (glm_moe_dsa); all 0 when the model has none.
  int64_t index_topk = 0;
  int64_t index_head_dim = 0;
  int64_t index_n_heads = 0;
  // Per target layer: true = "shared", reusing the previous full layer's top-k instead of running the indexer.
  std::vector<bool> indexer_shared_layers;

  // Through the architecture registry (model/arch): the config of whichever family member `model_type` names;
  // an architecture outside the family is an error naming it.
  static Result<ModelConfig> load(const std::filesystem::path& config_json);
  static Result<ModelConfig> from_json(const nlohmann::json& json, const std::string& source_name);
  // The family's reader with one member's rules.
  static Result<ModelConfig> from_json(const nlohmann::json& json, const std::string& source_name,
                                       const MlaMoeVariant& variant);

  bool has_indexer() const { return index_head_dim > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Layers past num_hidden_layers are MTP layers, which are MoE blocks in every supported model.
  bool is_moe(int64_t layer) const;
  bool indexer_is_shared(int64_t layer) const;
  // Softmax scale of MLA attention: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)² under YaRN.
  double attention_scale() const;
  ModelInfo to_model_info() const;
};

}  // namespace kiln
