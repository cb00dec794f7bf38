#include "model/arch/glm5_next/glm5_next_config.h"

#include <nlohmann/json.hpp>

#include "model/config_field_reader.h"

namespace kiln::glm5_next {
namespace {

using nlohmann::json;

Status read_scalars(const FieldReader& r, Glm5NextConfig& c) {
  for (auto [key, out] : {std::pair{"vocab_size", &c.vocab_size},
                          {"hidden_size", &c.hidden_size},
                          {"intermediate_size", &c.intermediate_size},
                          {"moe_intermediate_size", &c.moe_intermediate_size},
                          {"num_hidden_layers", &c.num_hidden_layers},
                          {"num_attention_heads", &c.num_attention_heads},
                          {"n_shared_experts", &c.n_shared_experts},
                          {"kv_lora_rank", &c.kv_lora_rank},
                          {"qk_rope_head_dim", &c.qk_rope_head_dim},
                          {"v_head_dim", &c.v_head_dim},
                          {"qk_nope_head_dim", &c.qk_nope_head_dim},
                          {"n_group", &c.n_group},
                          {"topk_group", &c.topk_group},
                          {"num_experts_per_tok", &c.num_experts_per_tok},
                          {"max_position_embeddings", &c.max_position_embeddings},
                          {"index_topk", &c.index_topk},
                          {"index_head_dim", &c.index_head_dim},
                          {"index_n_heads", &c.index_n_heads},
                          {"index_kpool", &c.index_kpool},
                          {"linear_head_dim", &c.linear_head_dim},
                          {"linear_num_heads", &c.linear_num_heads},
                          {"linear_conv_kernel_dim", &c.linear_conv_kernel_dim},
                          {"hc_mult", &c.hc_mult},
                          {"hc_sinkhorn_iters", &c.hc_sinkhorn_iters},
                          {"num_nextn_predict_layers", &c.num_nextn_predict_layers}})
    KILN_RETURN_IF_ERROR(r.read(key, *out));
  // num_local_experts is transformers' attribute_map alias of n_routed_experts (applied after it).
  KILN_RETURN_IF_ERROR(r.read_aliased({"n_routed_experts", "num_local_experts"}, c.n_routed_experts));
  // num_key_value_heads: null means "as many as the query heads" (__post_init__).
  c.num_key_value_heads = c.num_attention_heads;
  if (!r.is_null("num_key_value_heads")) KILN_RETURN_IF_ERROR(r.read("num_key_value_heads", c.num_key_value_heads));
  // q_lora_rank: null is allowed by the class and then refused by its validation; keep it distinguishable.
  if (r.is_null("q_lora_rank"))
    c.q_lora_rank = 0;
  else
    KILN_RETURN_IF_ERROR(r.read("q_lora_rank", c.q_lora_rank));
  for (auto [key, out] : {std::pair{"routed_scaling_factor", &c.routed_scaling_factor},
                          {"rms_norm_eps", &c.rms_norm_eps},
                          {"swiglu_limit", &c.swiglu_limit},
                          {"hc_eps", &c.hc_eps}})
    KILN_RETURN_IF_ERROR(r.read(key, *out));
  KILN_RETURN_IF_ERROR(r.read("linear_lower_bound", c.linear_lower_bound));
  for (auto [key, out] : {std::pair{"norm_topk_prob", &c.norm_topk_prob},
                          {"tie_word_embeddings", &c.tie_word_embeddings},
                          {"index_kpool_always_select_tail", &c.index_kpool_always_select_tail}})
    KILN_RETURN_IF_ERROR(r.read(key, *out));
  KILN_RETURN_IF_ERROR(r.read_id_list("eos_token_id", c.eos_token_ids));

  std::string act = "silu";
  KILN_RETURN_IF_ERROR(r.read("hidden_act", act));
  if (act != "silu") return r.value_error("hidden_act", "is \"" + act + "\"; glm5_next runs \"silu\" only");
  bool attention_bias = false;
  KILN_RETURN_IF_ERROR(r.read("attention_bias", attention_bias));
  if (attention_bias) return r.value_error("attention_bias", "is true; kiln's glm5_next has no attention biases");
  return ok_status();
}

// linear_attn_config (the original release's form) overrides the linear_* fields, as __post_init__ does; with
// safe_gate (default true) a missing lower bound becomes −5.
Status read_linear_attn_config(const FieldReader& top, const std::string& prefix, Glm5NextConfig& c) {
  if (!top.present("linear_attn_config") || top.is_null("linear_attn_config")) return ok_status();
  if (!top.at("linear_attn_config").is_object()) return top.type_error("linear_attn_config", "an object or null");
  FieldReader r(top.at("linear_attn_config"), c.source, prefix + "linear_attn_config.");
  KILN_RETURN_IF_ERROR(r.read("head_dim", c.linear_head_dim));
  KILN_RETURN_IF_ERROR(r.read("num_heads", c.linear_num_heads));
  KILN_RETURN_IF_ERROR(r.read("short_conv_kernel_size", c.linear_conv_kernel_dim));
  KILN_RETURN_IF_ERROR(r.read("gate_lower_bound", c.linear_lower_bound));
  bool safe_gate = true;
  KILN_RETURN_IF_ERROR(r.read("safe_gate", safe_gate));
  if (safe_gate && !c.linear_lower_bound) c.linear_lower_bound = -5.0;
  return ok_status();
}

std::string layer_field(const char* key, int64_t i) {
  return std::string(key) + "[" + std::to_string(i) + "]";
}

Status read_schedules(const FieldReader& r, Glm5NextConfig& c) {
  const int64_t n = c.num_hidden_layers;
  auto check_length = [&](const char* key, size_t size) -> Status {
    if (static_cast<int64_t>(size) != n)
      return r.value_error(key, "has " + std::to_string(size) + " entries; num_hidden_layers is " + std::to_string(n));
    return ok_status();
  };
  // Defaults: every fourth layer (i % 4 == 3) DSA, the rest KDA; the first three layers dense.
  KILN_ASSIGN_OR_RETURN(
      auto layer_types,
      r.read_choices("layer_types", {"linear_attention", "deepseek_sparse_attention", "full_attention"}));
  c.attention.clear();
  if (layer_types) {
    KILN_RETURN_IF_ERROR(check_length("layer_types", layer_types->size()));
    for (const std::string& t : *layer_types)
      c.attention.push_back(t == "linear_attention" ? AttentionKind::kKda : AttentionKind::kDsa);
  } else {
    for (int64_t i = 0; i < n; ++i) c.attention.push_back(i % 4 == 3 ? AttentionKind::kDsa : AttentionKind::kKda);
  }
  KILN_ASSIGN_OR_RETURN(auto mlp_types, r.read_choices("mlp_layer_types", {"dense", "sparse"}));
  c.moe.clear();
  if (mlp_types) {
    KILN_RETURN_IF_ERROR(check_length("mlp_layer_types", mlp_types->size()));
    for (const std::string& t : *mlp_types) c.moe.push_back(t == "sparse");
  } else {
    for (int64_t i = 0; i < n; ++i) c.moe.push_back(i >= 3);
  }

  // indexer_types, else the legacy index_topk_pattern ("FSSF…" or a list), else index_topk_freq /
  // index_skip_topk_offset: layer i is full when max(i − offset + 1, 0) is a multiple of freq.
  std::vector<std::string> indexer;
  const char* indexer_key = "indexer_types";
  KILN_ASSIGN_OR_RETURN(auto indexer_types, r.read_choices("indexer_types", {"full", "shared"}));
  if (indexer_types) {
    indexer = *indexer_types;
  } else if (r.present("index_topk_pattern") && r.at("index_topk_pattern").is_string()) {
    indexer_key = "index_topk_pattern";
    for (const char ch : r.at("index_topk_pattern").get<std::string>()) {
      if (ch != 'F' && ch != 'S')
        return r.value_error("index_topk_pattern",
                             "must be a string of 'F' (full) and 'S' (shared), got '" + std::string(1, ch) + "'");
      indexer.push_back(ch == 'F' ? "full" : "shared");
    }
  } else if (r.present("index_topk_pattern") && !r.is_null("index_topk_pattern")) {
    indexer_key = "index_topk_pattern";
    KILN_ASSIGN_OR_RETURN(auto pattern, r.read_choices("index_topk_pattern", {"full", "shared"}));
    indexer = *pattern;
  } else {
    int64_t freq = 1, offset = 2;
    KILN_RETURN_IF_ERROR(r.read("index_topk_freq", freq));
    KILN_RETURN_IF_ERROR(r.read("index_skip_topk_offset", offset));
    freq = std::max<int64_t>(freq, 1);
    for (int64_t i = 0; i < n; ++i)
      indexer.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  if (static_cast<int64_t>(indexer.size()) < n)
    return r.value_error(
        indexer_key, "has " + std::to_string(indexer.size()) + " entries; num_hidden_layers is " + std::to_string(n));
  // A shared layer reuses the selection the layer just before it hands on, and only a full DSA layer does.
  c.shared_indexer.assign(n, false);
  for (int64_t i = 0; i < n; ++i) {
    if (c.is_kda(i) || indexer[i] != "shared") continue;
    const std::string field = layer_field(indexer_key, i);
    if (i == 0) return r.value_error(field.c_str(), "is \"shared\" but layer 0 has no earlier indexer to share");
    if (c.is_kda(i - 1))
      return r.value_error(field.c_str(), "is \"shared\" but layer " + std::to_string(i - 1) +
                                              " is a linear_attention (KDA) layer, which selects nothing to share; "
                                              "a shared DSA layer must follow a full one");
    if (indexer[i - 1] != "full")
      return r.value_error(field.c_str(), "is \"shared\" but layer " + std::to_string(i - 1) +
                                              " is shared too; only a full DSA layer hands its selection on");
    c.shared_indexer[i] = true;
  }
  return ok_status();
}

// validate_architecture(), plus the shapes kiln's kernels need.
Status validate(const FieldReader& r, const Glm5NextConfig& c) {
  if (c.qk_rope_head_dim != 0)
    return r.value_error("qk_rope_head_dim",
                         "is " + std::to_string(c.qk_rope_head_dim) +
                             "; glm5_next has no positional encoding (NoPE DSA layers): it must be 0");
  if (c.num_attention_heads != c.num_key_value_heads)
    return r.value_error("num_key_value_heads", "is " + std::to_string(c.num_key_value_heads) +
                                                    "; it must equal num_attention_heads (" +
                                                    std::to_string(c.num_attention_heads) + ")");
  if (c.index_kpool < 1) return r.value_error("index_kpool", "must be positive, got " + std::to_string(c.index_kpool));
  if (c.index_topk < c.index_kpool || c.index_topk % c.index_kpool != 0)
    return r.value_error("index_topk", "(" + std::to_string(c.index_topk) +
                                           ") must be a positive multiple of index_kpool (" +
                                           std::to_string(c.index_kpool) + ")");
  if (c.q_lora_rank <= 0)
    return r.value_error("q_lora_rank", "must be set: the DSA layers and their indexer read the compressed query");
  for (auto [key, v] : {std::pair{"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"kv_lora_rank", c.kv_lora_rank},
                        {"qk_nope_head_dim", c.qk_nope_head_dim},
                        {"v_head_dim", c.v_head_dim},
                        {"index_head_dim", c.index_head_dim},
                        {"index_n_heads", c.index_n_heads},
                        {"linear_head_dim", c.linear_head_dim},
                        {"linear_num_heads", c.linear_num_heads},
                        {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
                        {"hc_mult", c.hc_mult},
                        {"hc_sinkhorn_iters", c.hc_sinkhorn_iters},
                        {"intermediate_size", c.intermediate_size}})
    if (v <= 0) return r.value_error(key, "must be positive, got " + std::to_string(v));
  const bool any_moe = std::find(c.moe.begin(), c.moe.end(), true) != c.moe.end();
  if (any_moe && (c.n_routed_experts <= 0 || c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.n_routed_experts ||
                  c.moe_intermediate_size <= 0))
    return r.value_error("num_experts_per_tok",
                         "must be in [1, n_routed_experts] with n_routed_experts and "
                         "moe_intermediate_size positive, for the sparse layers");
  if (any_moe && (c.n_group < 1 || c.n_routed_experts % c.n_group != 0 || c.topk_group < 1 || c.topk_group > c.n_group))
    return r.value_error("n_group", "must divide n_routed_experts, with 1 ≤ topk_group ≤ n_group");
  if (c.num_nextn_predict_layers < 0) return r.value_error("num_nextn_predict_layers", "must be ≥ 0");
  return ok_status();
}

}  // namespace

size_t Glm5NextConfig::kda_recurrent_bytes(int64_t heads) const {
  return sizeof(float) * static_cast<size_t>(heads * linear_head_dim * linear_head_dim);
}

size_t Glm5NextConfig::kda_conv_bytes(int64_t heads) const {
  return sizeof(float) * static_cast<size_t>((linear_conv_kernel_dim - 1) * 3 * heads * linear_head_dim);
}

ModelInfo Glm5NextConfig::to_model_info() const {
  ModelInfo m;
  m.model_type = "glm5_next";
  m.vocab_size = vocab_size;
  m.hidden_size = hidden_size;
  m.num_layers = num_hidden_layers;
  m.num_mtp_layers = static_cast<int64_t>(mtp.size());  // the next-n layers present and runnable
  m.num_heads = num_attention_heads;
  m.q_lora_rank = q_lora_rank;
  m.kv_lora_rank = kv_lora_rank;
  m.qk_nope_head_dim = qk_nope_head_dim;
  m.qk_rope_head_dim = qk_rope_head_dim;
  m.v_head_dim = v_head_dim;
  m.num_experts = n_routed_experts;
  m.experts_per_token = num_experts_per_tok;
  m.moe_intermediate_size = moe_intermediate_size;
  m.index_head_dim = index_head_dim;
  m.max_position_embeddings = max_position_embeddings;
  return m;
}

Result<Glm5NextConfig> Glm5NextConfig::from_json(const json& root, const std::string& source) {
  Glm5NextConfig c;
  c.source = source;
  // Glm5NextConfig nests the text model's fields in text_config; without one, they are at the top level.
  const bool nested = root.contains("text_config") && !root.at("text_config").is_null();
  if (nested && !root.at("text_config").is_object())
    return invalid_argument(source + ": field 'text_config' must be an object or null, got " +
                            root.at("text_config").dump());
  const std::string prefix = nested ? "text_config." : "";
  FieldReader r(nested ? root.at("text_config") : root, source, prefix);
  KILN_RETURN_IF_ERROR(read_scalars(r, c));
  c.num_nextn_predict_layers_given = r.present("num_nextn_predict_layers");
  KILN_RETURN_IF_ERROR(read_linear_attn_config(r, prefix, c));
  // The top-level tie_word_embeddings is the one Glm5NextForConditionalGeneration ties by; eos_token_id may sit at
  // either level of a nested config.
  if (nested) {
    const FieldReader top(root, source);
    KILN_RETURN_IF_ERROR(top.read("tie_word_embeddings", c.tie_word_embeddings));
    if (c.eos_token_ids.empty()) KILN_RETURN_IF_ERROR(top.read_id_list("eos_token_id", c.eos_token_ids));
  }
  KILN_RETURN_IF_ERROR(read_schedules(r, c));
  KILN_RETURN_IF_ERROR(validate(r, c));
  return c;
}

}  // namespace kiln::glm5_next
