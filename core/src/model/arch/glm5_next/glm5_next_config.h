// glm5_next (GLM-5.3-Flash): the text model's config as transformers 5.17 reads it (Glm5NextTextConfig), with its
// class defaults, its legacy keys and its validation (specs/glm5-next.md §6). The config.json may nest the text
// fields in `text_config` (beside a `vision_config`) or keep them at the top level, as the original release does.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kiln/model_info.h"
#include "kiln/status.h"

namespace kiln::glm5_next {

// layer_types: "linear_attention" (KDA) or "deepseek_sparse_attention" / its alias "full_attention" (DSA).
enum class AttentionKind { kKda, kDsa };

// A next-n (MTP) layer's structure, read from the tensor names its checkpoint holds (glm5_next_mtp_layout.h):
// transformers does not model the layer, so no config field describes it.
struct MtpLayerLayout {
  AttentionKind attention = AttentionKind::kKda;
  bool indexer = false;            // DSA with an indexer of its own; without one it attends densely (causal)
  bool hyper_connections = false;  // attn_hc / ffn_hc: hc_mult streams; without them a plain pre-norm residual
  bool moe = false;                // mlp.experts / mlp.gate, else a dense mlp.gate_proj
  bool own_head = false;           // shared_head.head, else the trunk's lm_head
};

struct Glm5NextConfig {
  std::string source;  // the config.json, for messages
  int64_t vocab_size = 154880;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 12288;
  int64_t moe_intermediate_size = 2048;
  int64_t num_hidden_layers = 45;
  int64_t num_attention_heads = 64;
  int64_t num_key_value_heads = 64;
  int64_t n_shared_experts = 1;
  int64_t n_routed_experts = 288;
  double routed_scaling_factor = 2.5;
  int64_t kv_lora_rank = 512;
  int64_t q_lora_rank = 1536;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 256;
  int64_t qk_nope_head_dim = 256;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t num_experts_per_tok = 8;
  bool norm_topk_prob = true;
  int64_t max_position_embeddings = 1048576;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  std::vector<int64_t> eos_token_ids;
  int64_t index_topk = 2048;
  int64_t index_head_dim = 128;
  int64_t index_n_heads = 32;
  int64_t index_kpool = 16;
  bool index_kpool_always_select_tail = true;
  double swiglu_limit = 10.0;
  int64_t linear_head_dim = 128;  // d_k = d_v of a KDA head
  int64_t linear_num_heads = 64;
  int64_t linear_conv_kernel_dim = 4;
  std::optional<double> linear_lower_bound = -5.0;  // none: the legacy softplus decay
  int64_t hc_mult = 4;
  double hc_eps = 1e-6;
  int64_t hc_sinkhorn_iters = 20;
  int64_t num_nextn_predict_layers = 0;  // next-n (MTP) layers stored after the trunk's
  bool num_nextn_predict_layers_given = false;  // in config.json; if not, the checkpoint's names decide

  // The checkpoint's next-n layers, when the architecture was parsed beside its checkpoint (parse_glm5_next):
  // the leading layers num_hidden_layers + i that are present, at most num_nextn_predict_layers. Empty when none
  // is stored (Hugging Face exports drop it) or no checkpoint was seen. mtp_refusal, when set, says why a present
  // layer cannot be run (a layout of names kiln does not know); loading the next-n layers then fails with it.
  std::vector<MtpLayerLayout> mtp;
  std::string mtp_refusal;

  // Per layer, after defaults and legacy keys are applied.
  std::vector<AttentionKind> attention;
  std::vector<bool> moe;             // mlp_layer_types[i] == "sparse"
  std::vector<bool> shared_indexer;  // a DSA layer that reuses the previous layer's selection

  bool is_kda(int64_t layer) const { return attention[layer] == AttentionKind::kKda; }
  // DSA layers with an indexer of their own (they cache its keys).
  bool runs_indexer(int64_t layer) const { return !is_kda(layer) && !shared_indexer[layer]; }
  int64_t kda_channels() const { return linear_num_heads * linear_head_dim; }  // of each of q, k, v
  // The selection a DSA query attends through: the top index_topk / index_kpool pools' tokens, then the tail.
  int64_t selection_width() const { return index_topk + (index_kpool_always_select_tail ? index_kpool - 1 : 0); }
  // Bytes of one sequence's KDA state in one layer: the recurrent [H, dk, dv] and the conv inputs
  // [kernel − 1, 3·H·dk], fp32.
  size_t kda_recurrent_bytes() const { return kda_recurrent_bytes(linear_num_heads); }
  size_t kda_conv_bytes() const { return kda_conv_bytes(linear_num_heads); }
  // A KDA layer's state slot: the recurrent state at byte 0, the conv state right after it.
  size_t kda_state_bytes() const { return kda_state_bytes(linear_num_heads); }
  // The same for `heads` of them: the slot of a rank that holds only its heads' state (the largest share of the
  // ranks' heads, TensorShard::max_count, so every rank's part fits), laid out as the whole one.
  size_t kda_recurrent_bytes(int64_t heads) const;
  size_t kda_conv_bytes(int64_t heads) const;
  size_t kda_state_bytes(int64_t heads) const { return kda_recurrent_bytes(heads) + kda_conv_bytes(heads); }
  // The pool keys' cache entry per token: one fp32 key of index_head_dim per index_kpool tokens, rounded up.
  size_t pool_key_bytes_per_token() const {
    return static_cast<size_t>((4 * index_head_dim + index_kpool - 1) / index_kpool);
  }

  ModelInfo to_model_info() const;

  // `json` is the whole config.json; errors name `source` and the field.
  static Result<Glm5NextConfig> from_json(const nlohmann::json& json, const std::string& source);
};

}  // namespace kiln::glm5_next
