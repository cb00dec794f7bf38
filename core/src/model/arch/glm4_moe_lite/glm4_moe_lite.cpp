// glm4_moe_lite (GLM-4.7-Flash): a member of the MLA + MoE family. Its transformers class defaults and config
// rules; the blocks are the family's.
#include "model/arch/glm4_moe_lite/glm4_moe_lite.h"

#include "model/mla_moe_architecture.h"

namespace kiln::arch {
namespace {

ModelConfig defaults() {
  ModelConfig c;
  c.vocab_size = 154880;
  c.hidden_size = 2048;
  c.intermediate_size = 10240;
  c.moe_intermediate_size = 1536;
  c.num_hidden_layers = 47;
  c.num_attention_heads = 20;
  c.num_key_value_heads = 20;
  c.n_shared_experts = 1;
  c.n_routed_experts = 64;
  c.routed_scaling_factor = 1.8;
  c.kv_lora_rank = 512;
  c.q_lora_rank = 768;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 256;
  c.qk_nope_head_dim = 192;
  c.n_group = 1;
  c.topk_group = 1;
  c.num_experts_per_tok = 4;
  c.max_position_embeddings = 202752;
  c.rms_norm_eps = 1e-5;
  return c;
}

MlaMoeVariant variant() {
  MlaMoeVariant v;
  v.model_type = "glm4_moe_lite";
  v.defaults = &defaults;
  // Glm4MoeLite has no first_k_dense_replace field: without mlp_layer_types it makes layer 0 dense only.
  v.dense_layers = MlaMoeVariant::DenseLayers::kLayerZero;
  v.head_dim_aliases_rope_dim = true;
  v.default_rope_reads_partial_rotary = true;  // Glm4MoeLiteRotaryEmbedding's default rope applies it
  return v;
}

}  // namespace

Result<std::unique_ptr<Architecture>> parse_glm4_moe_lite(const nlohmann::json& config, const std::string& source) {
  return parse_mla_moe_architecture(config, source, variant());
}

}  // namespace kiln::arch
