// deepseek_v3 (DeepSeek-V3): a member of the MLA + MoE family — YaRN rope, a grouped router (n_group /
// topk_group), its dense prefix from first_k_dense_replace alone.
#include "model/arch/deepseek_v3/deepseek_v3.h"

#include "model/mla_moe_architecture.h"

namespace kiln::arch {
namespace {

ModelConfig defaults() {
  ModelConfig c;
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 61;
  c.num_attention_heads = 128;
  c.num_key_value_heads = 128;
  c.n_shared_experts = 1;
  c.n_routed_experts = 256;
  c.routed_scaling_factor = 2.5;
  c.kv_lora_rank = 512;
  c.q_lora_rank = 1536;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.qk_nope_head_dim = 128;
  c.n_group = 8;
  c.topk_group = 4;
  c.num_experts_per_tok = 8;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6;
  c.num_nextn_predict_layers = 1;  // the class field num_mtp_layers
  return c;
}

MlaMoeVariant variant() {
  MlaMoeVariant v;
  v.model_type = "deepseek_v3";
  v.defaults = &defaults;
  // DeepseekV3 decides by first_k_dense_replace alone (class default 3) and ignores mlp_layer_types.
  v.dense_layers = MlaMoeVariant::DenseLayers::kFirstKDenseOnly;
  v.default_first_k_dense = 3;
  v.null_kv_heads_means_heads = true;
  v.num_mtp_layers_alias = true;
  return v;
}

}  // namespace

Result<std::unique_ptr<Architecture>> parse_deepseek_v3(const nlohmann::json& config, const std::string& source) {
  return parse_mla_moe_architecture(config, source, variant());
}

}  // namespace kiln::arch
