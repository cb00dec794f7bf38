#include "dflash_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/drafter.h"

namespace kiln::dflash {
namespace {

using json = nlohmann::json;

Status bad(const std::string& path, const std::string& what) { return invalid_argument(path + ": " + what); }

// A positive integer key (top level, or in dflash_config where the published configs put it).
Result<int64_t> positive(const json& j, const std::string& key, const std::string& path) {
  if (!j.contains(key) || !j[key].is_number_integer()) return bad(path, "needs an integer `" + key + "`");
  const int64_t v = j[key].get<int64_t>();
  if (v <= 0) return bad(path, "`" + key + "` = " + std::to_string(v) + " must be positive");
  return v;
}

// A key of the given JSON type when present and not null: nlohmann's value() throws on another type, which a corrupt
// config must not turn into a crash. get_or then reads it (null or absent: the fallback).
Status typed_if_present(const json& j, const std::string& key, json::value_t type, const char* what, const std::string& path) {
  if (!j.contains(key) || j[key].is_null() || j[key].type() == type) return Status();
  return bad(path, "`" + key + "` must be " + what + ", got " + j[key].dump());
}

template <class T>
T get_or(const json& j, const std::string& key, T fallback) {
  return j.contains(key) && !j[key].is_null() ? j[key].get<T>() : fallback;
}

double number_or(const json& j, const std::string& key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

}  // namespace

Result<DflashConfig> read_config(const std::string& dir, bool expect_v2, int64_t target_hidden, int64_t target_vocab,
                                 int64_t target_layers) {
  DflashConfig c;
  c.path = dir + "/config.json";
  std::ifstream in(c.path);
  if (!in) return not_found(c.path + ": cannot be read (speculative.draft_model must be a DFlash checkpoint directory)");
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad(c.path, "is not a JSON object");

  const std::string want = expect_v2 ? "DFlash2DraftModel" : "DFlashDraftModel";
  const std::string other = expect_v2 ? "DFlashDraftModel" : "DFlash2DraftModel";
  const json arch = j.value("architectures", json::array());
  const bool is_want = arch.is_array() && !arch.empty() && arch[0] == want;
  const bool is_other = arch.is_array() && !arch.empty() && arch[0] == other;
  if (!is_want)
    return bad(c.path, "architectures is " + arch.dump() + ", the drafter `" + std::string(expect_v2 ? "dflash2" : "dflash") +
                           "` loads [\"" + want + "\"]" +
                           (is_other ? std::string("; this is a ") + other + " checkpoint: select `" +
                                           (expect_v2 ? "dflash" : "dflash2") + "`"
                                     : ""));
  c.v2 = expect_v2;
  const json dc = j.value("dflash_config", json::object());
  if (!dc.is_object()) return bad(c.path, "`dflash_config` must be an object");

  KILN_ASSIGN_OR_RETURN(c.hidden, positive(j, "hidden_size", c.path));
  KILN_ASSIGN_OR_RETURN(c.intermediate, positive(j, "intermediate_size", c.path));
  KILN_ASSIGN_OR_RETURN(c.layers, positive(j, "num_hidden_layers", c.path));
  KILN_ASSIGN_OR_RETURN(c.heads, positive(j, "num_attention_heads", c.path));
  c.kv_heads = c.heads;
  if (j.contains("num_key_value_heads")) {
    KILN_ASSIGN_OR_RETURN(c.kv_heads, positive(j, "num_key_value_heads", c.path));
  }
  c.head_dim = c.hidden / c.heads;
  if (j.contains("head_dim")) {
    KILN_ASSIGN_OR_RETURN(c.head_dim, positive(j, "head_dim", c.path));
  }
  KILN_ASSIGN_OR_RETURN(c.vocab, positive(j, "vocab_size", c.path));
  if (c.heads % c.kv_heads != 0)
    return bad(c.path, "num_attention_heads " + std::to_string(c.heads) + " is not a multiple of num_key_value_heads " +
                           std::to_string(c.kv_heads));
  if (c.head_dim % 2 != 0) return bad(c.path, "head_dim must be even (rotate-half RoPE)");
  KILN_RETURN_IF_ERROR(typed_if_present(j, "hidden_act", json::value_t::string, "a string", c.path));
  KILN_RETURN_IF_ERROR(typed_if_present(j, "tie_word_embeddings", json::value_t::boolean, "a boolean", c.path));
  KILN_RETURN_IF_ERROR(typed_if_present(j, "use_sliding_window", json::value_t::boolean, "a boolean", c.path));
  if (get_or<std::string>(j, "hidden_act", "silu") != "silu") return bad(c.path, "hidden_act must be \"silu\"");
  if (get_or<bool>(j, "tie_word_embeddings", false)) return bad(c.path, "tie_word_embeddings must be false (the target's lm_head is used)");
  c.rms_eps = number_or(j, "rms_norm_eps", 1e-6);
  c.rope_theta = number_or(j, "rope_theta", 10000.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    c.rope_theta = number_or(j["rope_parameters"], "rope_theta", c.rope_theta);

  // The drafter shares the target's embedding, lm_head and hidden width.
  if (c.hidden != target_hidden)
    return bad(c.path, "hidden_size " + std::to_string(c.hidden) + " differs from the target's " +
                           std::to_string(target_hidden) + " (the drafter runs on the target's embeddings and lm_head)");
  if (c.vocab != target_vocab)
    return bad(c.path, "vocab_size " + std::to_string(c.vocab) + " differs from the target's " + std::to_string(target_vocab));
  if (j.contains("num_target_layers") && j["num_target_layers"].is_number_integer() &&
      j["num_target_layers"].get<int64_t>() != target_layers)
    return bad(c.path, "num_target_layers " + std::to_string(j["num_target_layers"].get<int64_t>()) +
                           " differs from the target's " + std::to_string(target_layers) + " layers");

  // Taps: the named layers' outputs, else the published default spread over the target.
  if (dc.contains("target_layer_ids")) {
    if (!dc["target_layer_ids"].is_array() || dc["target_layer_ids"].empty())
      return bad(c.path, "dflash_config.target_layer_ids must be a non-empty list of layer indices");
    for (const json& id : dc["target_layer_ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= target_layers)
        return bad(c.path, "dflash_config.target_layer_ids holds " + id.dump() + ", not a layer of the target (0.." +
                               std::to_string(target_layers - 1) + ")");
      // The references tap HF's hidden_states[id + 1]: a layer's residual output, except for the last layer,
      // whose entry HF records after the final norm — so a drafter tapping the last layer gets kTapFinalNormed.
      const int layer = id.get<int>();
      c.target_layers.push_back(layer == target_layers - 1 ? kTapFinalNormed : layer);
    }
  } else if (c.layers == 1) {
    c.target_layers = {static_cast<int>(target_layers / 2)};
  } else {
    for (int64_t i = 0; i < c.layers; ++i)
      c.target_layers.push_back(static_cast<int>(std::lround(1.0 + i * double(target_layers - 4) / double(c.layers - 1))));
  }

  if (!dc.contains("mask_token_id") || !dc["mask_token_id"].is_number_integer())
    return bad(c.path, "needs dflash_config.mask_token_id");
  const int64_t mask = dc["mask_token_id"].get<int64_t>();
  if (mask < 0 || mask >= c.vocab)
    return bad(c.path, "dflash_config.mask_token_id " + std::to_string(mask) + " is not a token id (vocabulary " +
                           std::to_string(c.vocab) + ")");
  c.mask_token = static_cast<int32_t>(mask);
  if (dc.contains("block_size")) {
    KILN_ASSIGN_OR_RETURN(c.block_size, positive(dc, "block_size", c.path));
  } else {
    KILN_ASSIGN_OR_RETURN(c.block_size, positive(j, "block_size", c.path));
  }
  if (c.block_size < 2) return bad(c.path, "block_size must be at least 2 (anchor + one draft)");
  c.output_multiplier = number_or(dc, "output_multiplier", 1.0);
  c.softcap = number_or(dc, "final_logit_softcapping", 0.0);
  c.input_embedding_scale = number_or(dc, "input_embedding_scale", 1.0);
  if (c.v2) {
    KILN_ASSIGN_OR_RETURN(c.conv_taps, positive(dc, "conv_kernel_size", c.path));
    KILN_ASSIGN_OR_RETURN(c.conv_group, positive(dc, "conv_group_size", c.path));
    KILN_ASSIGN_OR_RETURN(c.selector_rank, positive(dc, "selector_rank", c.path));
    KILN_ASSIGN_OR_RETURN(c.selector_top_k, positive(dc, "selector_top_k", c.path));
    if (c.hidden % c.conv_group != 0)
      return bad(c.path, "hidden_size " + std::to_string(c.hidden) + " is not a multiple of dflash_config.conv_group_size " +
                             std::to_string(c.conv_group));
    if (c.selector_top_k > c.vocab) return bad(c.path, "dflash_config.selector_top_k exceeds the vocabulary");
  }

  // Causality: top-level is_causal, then dflash_config.causal, then the legacy rule (causal iff sliding). Published
  // DFlash2 configs are sliding but not causal, which the override says.
  const json types = j.value("layer_types", json::array());
  if (!types.is_array() || (!types.empty() && static_cast<int64_t>(types.size()) != c.layers))
    return bad(c.path, "layer_types must list num_hidden_layers (" + std::to_string(c.layers) + ") entries");
  const int64_t window = j.contains("sliding_window") && j["sliding_window"].is_number_integer()
                             ? j["sliding_window"].get<int64_t>() : 0;
  const bool use_window = get_or<bool>(j, "use_sliding_window", true);
  for (int64_t i = 0; i < c.layers; ++i) {
    const bool sliding = !types.empty() && types[i] == "sliding_attention";
    LayerAttention a;
    if (j.contains("is_causal") && j["is_causal"].is_boolean()) a.causal = j["is_causal"].get<bool>();
    else if (dc.contains("causal") && dc["causal"].is_boolean()) a.causal = dc["causal"].get<bool>();
    else a.causal = sliding;
    a.window = sliding && use_window ? window : 0;
    if (sliding && use_window && window <= 0)
      return bad(c.path, "layer " + std::to_string(i) + " is sliding_attention but sliding_window is not a positive integer");
    c.attention.push_back(a);
  }
  return c;
}

}  // namespace kiln::dflash
