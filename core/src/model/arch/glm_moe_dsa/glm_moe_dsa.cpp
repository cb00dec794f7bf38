// glm_moe_dsa (GLM-5): a member of the MLA + MoE family with DSA sparse attention — the lightning indexer selects
// index_topk positions per query (on "full" layers; "shared" layers reuse the previous selection).
#include "model/arch/glm_moe_dsa/glm_moe_dsa.h"

#include "model/mla_moe_architecture.h"

namespace kiln::arch {
namespace {

ModelConfig defaults() {
  ModelConfig c;
  c.vocab_size = 154880;
  c.hidden_size = 6144;
  c.intermediate_size = 12288;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 78;
  c.num_attention_heads = 64;
  c.num_key_value_heads = 64;
  c.n_shared_experts = 1;
  c.n_routed_experts = 256;
  c.routed_scaling_factor = 2.5;
  c.kv_lora_rank = 512;
  c.q_lora_rank = 2048;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 256;
  c.qk_nope_head_dim = 192;
  c.n_group = 1;
  c.topk_group = 1;
  c.num_experts_per_tok = 8;
  c.max_position_embeddings = 202752;
  c.rms_norm_eps = 1e-5;
  c.index_topk = 2048;
  c.index_head_dim = 128;
  c.index_n_heads = 32;
  return c;
}

MlaMoeVariant variant() {
  MlaMoeVariant v;
  v.model_type = "glm_moe_dsa";
  v.defaults = &defaults;
  v.dense_layers = MlaMoeVariant::DenseLayers::kFirstKDense;
  v.default_first_k_dense = 3;
  v.num_experts_alias = true;
  // GlmMoeDsa always rotates interleaved pairs and has no switch for it.
  v.reads_rope_interleave = false;
  v.has_indexer = true;
  return v;
}

}  // namespace

Result<std::unique_ptr<Architecture>> parse_glm_moe_dsa(const nlohmann::json& config, const std::string& source) {
  return parse_mla_moe_architecture(config, source, variant());
}

}  // namespace kiln::arch
