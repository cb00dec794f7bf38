#include "model/arch/glm5_next/glm5_next_sharded_source.h"

#include <algorithm>

namespace kiln::glm5_next {

Status check_glm5_next_tensor_parallel_units(const Glm5NextConfig& c, int world) {
  const bool any_kda = std::find(c.attention.begin(), c.attention.end(), AttentionKind::kKda) != c.attention.end() ||
                       std::any_of(c.mtp.begin(), c.mtp.end(),
                                   [](const MtpLayerLayout& m) { return m.attention == AttentionKind::kKda; });
  const bool any_dsa = std::find(c.attention.begin(), c.attention.end(), AttentionKind::kDsa) != c.attention.end() ||
                       std::any_of(c.mtp.begin(), c.mtp.end(),
                                   [](const MtpLayerLayout& m) { return m.attention == AttentionKind::kDsa; });
  const bool any_dense = std::find(c.moe.begin(), c.moe.end(), false) != c.moe.end() ||
                         std::any_of(c.mtp.begin(), c.mtp.end(), [](const MtpLayerLayout& m) { return !m.moe; });
  const bool any_moe = std::find(c.moe.begin(), c.moe.end(), true) != c.moe.end() ||
                       std::any_of(c.mtp.begin(), c.mtp.end(), [](const MtpLayerLayout& m) { return m.moe; });
  struct Unit {
    const char* name;
    int64_t count;
    bool used;
  };
  const Unit units[] = {
      {"num_attention_heads", c.num_attention_heads, any_dsa},
      {"linear_num_heads", c.linear_num_heads, any_kda},
      {"vocab_size", c.vocab_size, true},
      {"n_routed_experts", c.n_routed_experts, any_moe},
      {"intermediate_size", c.intermediate_size, any_dense},
      {"moe_intermediate_size × n_shared_experts", c.moe_intermediate_size * c.n_shared_experts,
       any_moe && c.n_shared_experts > 0}};
  for (const Unit& u : units)
    if (u.used && u.count < world)
      return invalid_argument("parallel.tensor = " + std::to_string(world) + ": " + c.source + " has " + u.name +
                              " = " + std::to_string(u.count) + ", fewer than the ranks that split it");
  return ok_status();
}

RowShardedSource::RowSplit Glm5NextShardedSource::row_split(const std::string& module) const {
  const Glm5NextConfig& c = config_;
  if (module.ends_with(".embed_tokens") || module == "lm_head" || module.ends_with(".shared_head.head"))
    return {c.vocab_size, 1};
  // DSA: q_b_proj rows are [heads, nope], kv_b_proj rows [heads, nope + v].
  if (module.ends_with(".self_attn.q_b_proj")) return {c.num_attention_heads, c.qk_nope_head_dim};
  if (module.ends_with(".self_attn.kv_b_proj")) return {c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim};
  // KDA: [heads, head_dim] channels; b_proj one row (β) per head.
  if (module.ends_with(".self_attn.q_proj") || module.ends_with(".self_attn.k_proj") ||
      module.ends_with(".self_attn.v_proj") || module.ends_with(".self_attn.forget_gate.f_b_proj") ||
      module.ends_with(".self_attn.g_b_proj"))
    return {c.linear_num_heads, c.linear_head_dim};
  if (module.ends_with(".self_attn.b_proj")) return {c.linear_num_heads, 1};
  if (module.ends_with(".mlp.shared_experts.gate_proj") || module.ends_with(".mlp.shared_experts.up_proj"))
    return {c.moe_intermediate_size * c.n_shared_experts, 1};
  if (routed_expert_of(module + ".") < 0 &&
      (module.ends_with(".mlp.gate_proj") || module.ends_with(".mlp.up_proj")))
    return {c.intermediate_size, 1};
  return {};
}

}  // namespace kiln::glm5_next
