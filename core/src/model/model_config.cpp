#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numbers>
#include <tuple>

#include "model/config_field_reader.h"

namespace kiln {
namespace {

using nlohmann::json;

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// Resolves rope settings as transformers' convert_rope_params_to_dict / standardize_rope_params and
// _compute_yarn_parameters do: a non-empty `rope_scaling` wins over `rope_parameters`; `rope_theta` and
// `partial_rotary_factor` inside the dict win over top-level keys; `rope_type` falls back to legacy `type`.
Status read_rope(const json& root, const FieldReader& top, const MlaMoeVariant& v, ModelConfig& c) {
  const char* dict_key = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!top.present(key) || top.is_null(key)) continue;
    if (!top.at(key).is_object()) return top.type_error(key, "an object or null");
    if (!top.at(key).empty()) dict_key = key;
  }
  RopeConfig& rope = c.rope;
  KILN_RETURN_IF_ERROR(top.read("rope_theta", rope.theta));
  KILN_RETURN_IF_ERROR(top.read("partial_rotary_factor", rope.partial_rotary_factor));
  std::string partial_key = "partial_rotary_factor";
  // transformers builds int(qk_rope_head_dim · factor) / 2 frequencies but rotates all qk_rope_head_dim values of
  // q and k with them: any factor but 1 either fails there or rotates every pair by the first frequency. kiln
  // rotates all of them with their own frequencies, so a config where the factor is read and is not 1 is refused
  // rather than run as something else. (Where the class's rope ignores it, kiln ignores it too.)
  auto refuse_partial = [&]() -> Status {
    if (rope.partial_rotary_factor == 1.0) return ok_status();
    return unimplemented(c.source + ": field '" + partial_key + "' is " + json(rope.partial_rotary_factor).dump() +
                         "; " + c.model_type + "'s " + rope_type_name(rope.type) +
                         " rope reads it, and its attention rotates all qk_rope_head_dim values, so only 1 describes "
                         "a model that runs (kiln does not support partial rotary MLA)");
  };
  if (dict_key == nullptr) return v.default_rope_reads_partial_rotary ? refuse_partial() : ok_status();

  const std::string source_prefix = std::string(dict_key) + ".";
  const json& dict = root.at(dict_key);
  const std::string& source = c.source;
  FieldReader r(dict, source, source_prefix);
  KILN_RETURN_IF_ERROR(r.read("rope_theta", rope.theta));
  KILN_RETURN_IF_ERROR(r.read("partial_rotary_factor", rope.partial_rotary_factor));
  if (r.present("partial_rotary_factor")) partial_key = source_prefix + "partial_rotary_factor";
  std::string type = "default";
  KILN_RETURN_IF_ERROR(r.read_aliased({"type", "rope_type"}, type));
  if (type == "default") return v.default_rope_reads_partial_rotary ? refuse_partial() : ok_status();
  static constexpr RopeType kScaled[] = {RopeType::kYarn, RopeType::kLinear, RopeType::kLlama3, RopeType::kDynamic};
  const auto known = std::ranges::find(kScaled, type, rope_type_name);
  if (known == std::end(kScaled)) {
    const std::string why =
        type == "longrope"
            ? " (longrope switches every position's frequencies once a sequence passes "
              "original_max_position_embeddings, so cached keys would disagree with new queries)"
            : "";
    return unimplemented(source + ": field '" + source_prefix + "rope_type' is '" + type +
                         "'; kiln supports \"default\", \"yarn\", \"linear\", \"llama3\" and \"dynamic\"" + why);
  }
  rope.type = *known;
  // Every scaled type builds its table from int(qk_rope_head_dim · partial_rotary_factor).
  KILN_RETURN_IF_ERROR(refuse_partial());

  // transformers indexes rope_parameters["factor"] for every scaled type: a missing one fails there.
  if (!r.present("factor")) {
    return invalid_argument(source + ": " + type + " rope needs field '" + source_prefix + "factor'");
  }
  const bool yarn = rope.type == RopeType::kYarn;
  if (yarn || rope.type == RopeType::kLlama3) {
    rope.original_max_position_embeddings = c.max_position_embeddings;
    KILN_RETURN_IF_ERROR(r.read("original_max_position_embeddings", rope.original_max_position_embeddings));
    // A top-level original_max_position_embeddings takes precedence when transformers builds the rotary table.
    KILN_RETURN_IF_ERROR(top.read("original_max_position_embeddings", rope.original_max_position_embeddings));
    if (rope.original_max_position_embeddings <= 0) {
      return r.value_error("original_max_position_embeddings", "must be positive");
    }
  }
  if (yarn && r.is_null("factor")) {
    rope.factor = static_cast<double>(c.max_position_embeddings) / rope.original_max_position_embeddings;
  } else {
    KILN_RETURN_IF_ERROR(r.read("factor", rope.factor));
  }
  if (!(rope.factor > 0)) return r.value_error("factor", "must be positive");

  // `or` semantics in transformers: absent, null and 0 all mean "use the default".
  auto read_or_default = [&](const char* key, double& out) -> Status {
    if (!r.present(key) || r.is_null(key)) return ok_status();
    double v = 0;
    KILN_RETURN_IF_ERROR(r.read(key, v));
    if (v != 0) out = v;
    return ok_status();
  };
  // yarn_apply_mscale scales the softmax by mscale_all_dim for every rope type but default.
  KILN_RETURN_IF_ERROR(read_or_default("mscale_all_dim", rope.mscale_all_dim));

  if (rope.type == RopeType::kLlama3) {
    for (const char* key : {"low_freq_factor", "high_freq_factor"}) {
      if (!r.present(key)) return invalid_argument(source + ": llama3 rope needs field '" + source_prefix + key + "'");
    }
    KILN_RETURN_IF_ERROR(r.read("low_freq_factor", rope.low_freq_factor));
    KILN_RETURN_IF_ERROR(r.read("high_freq_factor", rope.high_freq_factor));
    if (!(rope.low_freq_factor > 0)) return r.value_error("low_freq_factor", "must be positive");
    // Equal factors leave the blend's denominator 0 (transformers computes NaN frequencies there).
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      return r.value_error("high_freq_factor", "must exceed low_freq_factor (" + json(rope.low_freq_factor).dump() + ")");
    }
  }
  if (!yarn) return ok_status();

  KILN_RETURN_IF_ERROR(read_or_default("beta_fast", rope.beta_fast));
  KILN_RETURN_IF_ERROR(read_or_default("beta_slow", rope.beta_slow));
  KILN_RETURN_IF_ERROR(read_or_default("mscale", rope.mscale));
  KILN_RETURN_IF_ERROR(r.read("truncate", rope.truncate));

  if (r.present("attention_factor") && !r.is_null("attention_factor")) {
    KILN_RETURN_IF_ERROR(r.read("attention_factor", rope.attention_factor));
  } else if (rope.mscale != 0 && rope.mscale_all_dim != 0) {
    rope.attention_factor = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim);
  } else {
    rope.attention_factor = yarn_mscale(rope.factor, 1.0);
  }
  return ok_status();
}

Status read_moe_layers(const FieldReader& r, const MlaMoeVariant& v, ModelConfig& c) {
  const int64_t n = c.num_hidden_layers;
  KILN_ASSIGN_OR_RETURN(auto types, r.read_choices("mlp_layer_types", {"dense", "sparse"}));
  std::optional<int64_t> first_k_dense;
  if (r.present("first_k_dense_replace")) {
    int64_t v = 0;
    KILN_RETURN_IF_ERROR(r.read("first_k_dense_replace", v));
    if (v < 0) return r.value_error("first_k_dense_replace", "must be ≥ 0, got " + std::to_string(v));
    first_k_dense = v;
  }

  int64_t dense_prefix = 0;
  using Rule = MlaMoeVariant::DenseLayers;
  if (v.dense_layers == Rule::kFirstKDenseOnly) {
    // DeepseekV3 decides by first_k_dense_replace alone and ignores mlp_layer_types.
    types.reset();
    dense_prefix = first_k_dense.value_or(v.default_first_k_dense);
  } else if (v.dense_layers == Rule::kFirstKDense) {
    dense_prefix = first_k_dense.value_or(v.default_first_k_dense);
  } else {
    // Glm4MoeLite has no first_k_dense_replace field: without mlp_layer_types it makes layer 0 dense only.
    // A config asking for a different dense prefix would silently get the wrong blocks, so refuse it.
    if (!types && first_k_dense && *first_k_dense != 1) {
      return r.value_error("first_k_dense_replace", "is " + std::to_string(*first_k_dense) +
                                                        ", but " + c.model_type + " ignores it and makes only layer 0 dense; "
                                                        "give mlp_layer_types explicitly");
    }
    dense_prefix = 1;
  }

  c.moe_layers.assign(static_cast<size_t>(n), true);
  if (types) {
    if (static_cast<int64_t>(types->size()) != n) {
      return r.value_error("mlp_layer_types", "has " + std::to_string(types->size()) +
                                                  " entries but num_hidden_layers is " + std::to_string(n));
    }
    for (int64_t i = 0; i < n; ++i) c.moe_layers[i] = (*types)[i] == "sparse";
  } else {
    for (int64_t i = 0; i < std::min(dense_prefix, n); ++i) c.moe_layers[i] = false;
  }
  return ok_status();
}

// GlmMoeDsa: explicit indexer_types, else index_topk_pattern ("FSSF…" or a list), else the
// index_topk_freq / index_skip_topk_offset schedule (defaults 1 and 2: every layer runs its indexer).
Status read_indexer_layers(const FieldReader& r, ModelConfig& c) {
  const int64_t n = c.num_hidden_layers;
  KILN_ASSIGN_OR_RETURN(auto types, r.read_choices("indexer_types", {"full", "shared"}));
  const char* field = "indexer_types";
  if (!types && r.present("index_topk_pattern") && !r.is_null("index_topk_pattern")) {
    field = "index_topk_pattern";
    const json& pattern = r.at(field);
    if (pattern.is_string()) {
      types.emplace();
      for (char ch : pattern.get<std::string>()) {
        if (ch != 'F' && ch != 'S') return r.value_error(field, "may contain only 'F' and 'S'");
        types->push_back(ch == 'F' ? "full" : "shared");
      }
    } else {
      KILN_ASSIGN_OR_RETURN(types, r.read_choices(field, {"full", "shared"}));
    }
  }
  c.indexer_shared_layers.assign(static_cast<size_t>(n), false);
  if (types) {
    if (static_cast<int64_t>(types->size()) != n) {
      return r.value_error(
          field, "has " + std::to_string(types->size()) + " entries but num_hidden_layers is " + std::to_string(n));
    }
    for (int64_t i = 0; i < n; ++i) c.indexer_shared_layers[i] = (*types)[i] == "shared";
  } else {
    int64_t freq = 1;
    int64_t offset = 2;
    KILN_RETURN_IF_ERROR(r.read("index_topk_freq", freq));
    KILN_RETURN_IF_ERROR(r.read("index_skip_topk_offset", offset));
    freq = std::max<int64_t>(freq, 1);
    for (int64_t i = 0; i < n; ++i) c.indexer_shared_layers[i] = std::max<int64_t>(i - offset + 1, 0) % freq != 0;
  }
  if (n > 0 && c.indexer_shared_layers[0]) {
    return r.value_error(field, "makes layer 0 \"shared\", but a shared layer needs an earlier full layer's top-k");
  }
  return ok_status();
}

Status validate(const FieldReader& r, const MlaMoeVariant& v, const ModelConfig& c) {
  auto require = [&](const char* key, int64_t value, int64_t min) -> Status {
    if (value < min) {
      return r.value_error(key, "must be ≥ " + std::to_string(min) + ", got " + std::to_string(value));
    }
    return ok_status();
  };
  for (const auto& [key, value, min] : std::initializer_list<std::tuple<const char*, int64_t, int64_t>>{
           {"vocab_size", c.vocab_size, 1},
           {"hidden_size", c.hidden_size, 1},
           {"intermediate_size", c.intermediate_size, 1},
           {"moe_intermediate_size", c.moe_intermediate_size, 1},
           {"num_hidden_layers", c.num_hidden_layers, 1},
           {"num_attention_heads", c.num_attention_heads, 1},
           {"num_key_value_heads", c.num_key_value_heads, 1},
           {"q_lora_rank", c.q_lora_rank, 0},
           {"kv_lora_rank", c.kv_lora_rank, 1},
           {"qk_nope_head_dim", c.qk_nope_head_dim, 0},
           {"qk_rope_head_dim", c.qk_rope_head_dim, 0},
           {"v_head_dim", c.v_head_dim, 1},
           {"n_routed_experts", c.n_routed_experts, 1},
           {"n_shared_experts", c.n_shared_experts, 0},
           {"num_experts_per_tok", c.num_experts_per_tok, 1},
           {"n_group", c.n_group, 1},
           {"topk_group", c.topk_group, 1},
           {"max_position_embeddings", c.max_position_embeddings, 1},
           {"num_nextn_predict_layers", c.num_nextn_predict_layers, 0},
       }) {
    KILN_RETURN_IF_ERROR(require(key, value, min));
  }
  if (c.qk_nope_head_dim + c.qk_rope_head_dim < 1) {
    return r.value_error("qk_nope_head_dim", "plus qk_rope_head_dim must be positive");
  }
  if (c.qk_rope_head_dim % 2 != 0) {
    return r.value_error("qk_rope_head_dim",
                         "must be even (rope rotates pairs), got " + std::to_string(c.qk_rope_head_dim));
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    return r.value_error("num_experts_per_tok", "(" + std::to_string(c.num_experts_per_tok) +
                                                    ") exceeds n_routed_experts (" +
                                                    std::to_string(c.n_routed_experts) + ")");
  }
  if (c.n_routed_experts % c.n_group != 0) {
    return r.value_error("n_group", "(" + std::to_string(c.n_group) + ") must divide n_routed_experts (" +
                                        std::to_string(c.n_routed_experts) + ")");
  }
  if (c.topk_group > c.n_group) {
    return r.value_error("topk_group",
                         "(" + std::to_string(c.topk_group) + ") exceeds n_group (" + std::to_string(c.n_group) + ")");
  }
  if (!(c.rms_norm_eps > 0)) return r.value_error("rms_norm_eps", "must be positive");
  if (!(c.rope.theta > 0)) return r.value_error("rope_theta", "must be positive");
  if (!(c.rope.partial_rotary_factor > 0 && c.rope.partial_rotary_factor <= 1)) {
    return r.value_error("partial_rotary_factor", "must be in (0, 1]");
  }
  if (v.has_indexer) {
    KILN_RETURN_IF_ERROR(require("index_head_dim", c.index_head_dim, 1));
    KILN_RETURN_IF_ERROR(require("index_topk", c.index_topk, 1));
    KILN_RETURN_IF_ERROR(require("index_n_heads", c.index_n_heads, 1));
  }
  // The family's router is fixed in the reference implementation; a config naming another one describes a
  // model this code would run wrongly.
  if (c.scoring_func != "sigmoid") {
    return unimplemented(c.source + ": field 'scoring_func' is '" + c.scoring_func + "'; kiln supports \"sigmoid\"");
  }
  if (c.topk_method != "noaux_tc") {
    return unimplemented(c.source + ": field 'topk_method' is '" + c.topk_method + "'; kiln supports \"noaux_tc\"");
  }
  if (c.hidden_act != "silu") {
    return unimplemented(c.source + ": field 'hidden_act' is '" + c.hidden_act + "'; kiln supports \"silu\"");
  }
  return ok_status();
}

// The grouped router as transformers runs it at every MoE layer; a stack without MoE layers never routes (a dense
// checkpoint may keep the class's n_group default of 8 with 8 experts).
Status validate_router(const FieldReader& r, const ModelConfig& c) {
  const int64_t group_size = c.n_routed_experts / c.n_group;
  // A group's score is the sum of its two best experts (transformers' topk(2) fails on smaller groups).
  if (c.n_group > 1 && group_size < 2) {
    return r.value_error("n_group", "(" + std::to_string(c.n_group) + ") leaves " + std::to_string(group_size) +
                                        " expert per group; group scores sum each group's two best experts");
  }
  // Beyond the kept groups' experts, top-k would pick among masked (-inf) experts: an arbitrary choice.
  if (c.n_group > 1 && c.num_experts_per_tok > c.topk_group * group_size) {
    return r.value_error("num_experts_per_tok", "(" + std::to_string(c.num_experts_per_tok) + ") exceeds the " +
                                                    std::to_string(c.topk_group * group_size) +
                                                    " experts of the topk_group kept groups");
  }
  return ok_status();
}

}  // namespace

const char* rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::kDefault: return "default";
    case RopeType::kYarn: return "yarn";
    case RopeType::kLinear: return "linear";
    case RopeType::kLlama3: return "llama3";
    case RopeType::kDynamic: return "dynamic";
  }
  return "?";
}

Result<ModelConfig> ModelConfig::from_json(const json& root, const std::string& source_name, const MlaMoeVariant& v) {
  if (!root.is_object()) return invalid_argument(source_name + ": config must be a JSON object");
  FieldReader r(root, source_name);
  ModelConfig c = v.defaults();
  c.model_type = v.model_type;
  c.source = source_name;
  const std::string model_type = c.model_type;

  KILN_RETURN_IF_ERROR(r.read("vocab_size", c.vocab_size));
  KILN_RETURN_IF_ERROR(r.read("hidden_size", c.hidden_size));
  KILN_RETURN_IF_ERROR(r.read("intermediate_size", c.intermediate_size));
  KILN_RETURN_IF_ERROR(r.read("moe_intermediate_size", c.moe_intermediate_size));
  KILN_RETURN_IF_ERROR(r.read("num_hidden_layers", c.num_hidden_layers));
  KILN_RETURN_IF_ERROR(r.read("num_attention_heads", c.num_attention_heads));
  if (v.null_kv_heads_means_heads && r.is_null("num_key_value_heads")) {
    c.num_key_value_heads = c.num_attention_heads;
  } else {
    // Like transformers, a missing key keeps the class default even when num_attention_heads changed
    // (MLA does not use it).
    KILN_RETURN_IF_ERROR(r.read("num_key_value_heads", c.num_key_value_heads));
  }
  if (r.is_null("q_lora_rank")) {
    c.q_lora_rank = 0;
  } else {
    KILN_RETURN_IF_ERROR(r.read("q_lora_rank", c.q_lora_rank));
  }
  KILN_RETURN_IF_ERROR(r.read("kv_lora_rank", c.kv_lora_rank));
  KILN_RETURN_IF_ERROR(r.read("qk_nope_head_dim", c.qk_nope_head_dim));
  KILN_RETURN_IF_ERROR(v.head_dim_aliases_rope_dim ? r.read_aliased({"qk_rope_head_dim", "head_dim"}, c.qk_rope_head_dim)
                                                   : r.read("qk_rope_head_dim", c.qk_rope_head_dim));
  KILN_RETURN_IF_ERROR(r.read("v_head_dim", c.v_head_dim));

  KILN_RETURN_IF_ERROR(
      v.num_experts_alias
          ? r.read_aliased({"n_routed_experts", "num_local_experts", "num_experts"}, c.n_routed_experts)
          : r.read_aliased({"n_routed_experts", "num_local_experts"}, c.n_routed_experts));
  KILN_RETURN_IF_ERROR(r.read("n_shared_experts", c.n_shared_experts));
  KILN_RETURN_IF_ERROR(r.read("num_experts_per_tok", c.num_experts_per_tok));
  KILN_RETURN_IF_ERROR(r.read("n_group", c.n_group));
  KILN_RETURN_IF_ERROR(r.read("topk_group", c.topk_group));
  KILN_RETURN_IF_ERROR(r.read("routed_scaling_factor", c.routed_scaling_factor));
  KILN_RETURN_IF_ERROR(r.read("norm_topk_prob", c.norm_topk_prob));
  KILN_RETURN_IF_ERROR(r.read("scoring_func", c.scoring_func));
  KILN_RETURN_IF_ERROR(r.read("topk_method", c.topk_method));
  KILN_RETURN_IF_ERROR(r.read("hidden_act", c.hidden_act));

  KILN_RETURN_IF_ERROR(r.read("rms_norm_eps", c.rms_norm_eps));
  KILN_RETURN_IF_ERROR(r.read("attention_bias", c.attention_bias));
  // transformers then adds biases to q_a_proj (or nothing on q_proj), kv_a_proj_with_mqa and o_proj; kiln's MLA
  // has none, and running without them would be another model.
  if (c.attention_bias) {
    return unimplemented(source_name + ": field 'attention_bias' is true; kiln's MLA projections have no biases "
                                       "(q_a_proj, kv_a_proj_with_mqa and o_proj would need them)");
  }
  KILN_RETURN_IF_ERROR(r.read("tie_word_embeddings", c.tie_word_embeddings));
  KILN_RETURN_IF_ERROR(r.read("max_position_embeddings", c.max_position_embeddings));
  KILN_RETURN_IF_ERROR(v.num_mtp_layers_alias
                           ? r.read_aliased({"num_mtp_layers", "num_nextn_predict_layers"}, c.num_nextn_predict_layers)
                           : r.read("num_nextn_predict_layers", c.num_nextn_predict_layers));

  c.bos_token_id = 0;  // every supported class defaults to bos 0, eos 1, no pad
  c.eos_token_ids = {1};
  KILN_RETURN_IF_ERROR(r.read("bos_token_id", c.bos_token_id));
  KILN_RETURN_IF_ERROR(r.read_id_list("eos_token_id", c.eos_token_ids));
  KILN_RETURN_IF_ERROR(r.read("pad_token_id", c.pad_token_id));

  if (v.reads_rope_interleave) KILN_RETURN_IF_ERROR(r.read("rope_interleave", c.rope.interleave));
  KILN_RETURN_IF_ERROR(read_rope(root, r, v, c));

  if (v.has_indexer) {
    bool mlp_bias = false;
    KILN_RETURN_IF_ERROR(r.read("mlp_bias", mlp_bias));
    if (mlp_bias) return unimplemented(source_name + ": field 'mlp_bias' is true; kiln's MLPs have no bias");
    KILN_RETURN_IF_ERROR(r.read("index_topk", c.index_topk));
    KILN_RETURN_IF_ERROR(r.read("index_head_dim", c.index_head_dim));
    KILN_RETURN_IF_ERROR(r.read("index_n_heads", c.index_n_heads));
  }

  KILN_RETURN_IF_ERROR(validate(r, v, c));
  KILN_RETURN_IF_ERROR(read_moe_layers(r, v, c));
  if (c.num_nextn_predict_layers > 0 || std::find(c.moe_layers.begin(), c.moe_layers.end(), true) != c.moe_layers.end())
    KILN_RETURN_IF_ERROR(validate_router(r, c));
  if (v.has_indexer) KILN_RETURN_IF_ERROR(read_indexer_layers(r, c));
  return c;
}

bool ModelConfig::is_moe(int64_t layer) const {
  if (layer < 0) return false;
  if (layer >= num_hidden_layers) return layer < num_hidden_layers + num_nextn_predict_layers;
  return moe_layers[static_cast<size_t>(layer)];
}

bool ModelConfig::indexer_is_shared(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(indexer_shared_layers.size())) return false;
  return indexer_shared_layers[static_cast<size_t>(layer)];
}

double ModelConfig::attention_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.type != RopeType::kDefault && rope.mscale_all_dim != 0) {
    const double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

ModelInfo ModelConfig::to_model_info() const {
  ModelInfo info;
  info.model_type = model_type;
  info.vocab_size = vocab_size;
  info.hidden_size = hidden_size;
  info.num_layers = num_hidden_layers;
  info.num_mtp_layers = num_nextn_predict_layers;
  info.num_heads = num_attention_heads;
  info.q_lora_rank = q_lora_rank;
  info.kv_lora_rank = kv_lora_rank;
  info.qk_nope_head_dim = qk_nope_head_dim;
  info.qk_rope_head_dim = qk_rope_head_dim;
  info.v_head_dim = v_head_dim;
  info.num_experts = n_routed_experts;
  info.experts_per_token = num_experts_per_tok;
  info.moe_intermediate_size = moe_intermediate_size;
  info.index_head_dim = index_head_dim;
  info.max_position_embeddings = max_position_embeddings;
  return info;
}

}  // namespace kiln
