#include "model/arch/glm5_next/glm5_next_sharded_source.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace kiln::glm5_next {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "….mlp.experts.5.gate_proj.weight" → the position of "5" and its length, or npos.
std::pair<size_t, size_t> expert_index(const std::string& name) {
  static const std::string kExperts = ".mlp.experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return {std::string::npos, 0};
  const size_t begin = at + kExperts.size();
  size_t end = begin;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == begin || end >= name.size() || name[end] != '.') return {std::string::npos, 0};
  return {begin, end - begin};
}

}  // namespace

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

Glm5NextShardedSource::RowSplit Glm5NextShardedSource::row_split(const std::string& module) const {
  const Glm5NextConfig& c = config_;
  if (ends_with(module, ".embed_tokens") || module == "lm_head" || ends_with(module, ".shared_head.head"))
    return {c.vocab_size, 1};
  // DSA: q_b_proj rows are [heads, nope], kv_b_proj rows [heads, nope + v].
  if (ends_with(module, ".self_attn.q_b_proj")) return {c.num_attention_heads, c.qk_nope_head_dim};
  if (ends_with(module, ".self_attn.kv_b_proj")) return {c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim};
  // KDA: [heads, head_dim] channels; b_proj one row (β) per head.
  if (ends_with(module, ".self_attn.q_proj") || ends_with(module, ".self_attn.k_proj") ||
      ends_with(module, ".self_attn.v_proj") || ends_with(module, ".self_attn.forget_gate.f_b_proj") ||
      ends_with(module, ".self_attn.g_b_proj"))
    return {c.linear_num_heads, c.linear_head_dim};
  if (ends_with(module, ".self_attn.b_proj")) return {c.linear_num_heads, 1};
  if (ends_with(module, ".mlp.shared_experts.gate_proj") || ends_with(module, ".mlp.shared_experts.up_proj"))
    return {c.moe_intermediate_size * c.n_shared_experts, 1};
  if (expert_index(module + ".").first == std::string::npos &&
      (ends_with(module, ".mlp.gate_proj") || ends_with(module, ".mlp.up_proj")))
    return {c.intermediate_size, 1};
  return {};
}

std::string Glm5NextShardedSource::stored_name(const std::string& name) const {
  const auto [at, len] = expert_index(name);
  if (at == std::string::npos) return name;
  const int64_t local = std::strtoll(name.substr(at, len).c_str(), nullptr, 10);
  return name.substr(0, at) + std::to_string(shard_.begin(config_.n_routed_experts) + local) + name.substr(at + len);
}

bool Glm5NextShardedSource::beyond_local_experts(const std::string& name) const {
  const auto [at, len] = expert_index(name);
  return at != std::string::npos &&
         std::strtoll(name.substr(at, len).c_str(), nullptr, 10) >= shard_.count(config_.n_routed_experts);
}

bool Glm5NextShardedSource::has(const std::string& name) const {
  return !beyond_local_experts(name) && names_.has(stored_name(name));
}

Result<TensorView> Glm5NextShardedSource::get(const std::string& name) const {
  if (beyond_local_experts(name))
    return not_found("tensor parallel rank " + std::to_string(shard_.rank) + " holds " +
                     std::to_string(shard_.count(config_.n_routed_experts)) + " routed experts; `" + name +
                     "` is not one of them");
  const std::string stored = stored_name(name);
  const size_t dot = name.rfind('.');
  const std::string module = dot == std::string::npos ? name : name.substr(0, dot);
  const RowSplit split = row_split(module);
  if (split.units == 0 || !shard_.sharded()) return names_.get(stored);
  const std::string where = "tensor parallelism (rank " + std::to_string(shard_.rank) + " of " +
                            std::to_string(shard_.world) + "): `" + name + "`";
  if (name.substr(dot + 1) != "weight")
    return unimplemented(where + " belongs to a module the ranks split by rows, and only dense `.weight` matrices "
                                 "can be split (quantized formats are not sharded yet)");
  KILN_ASSIGN_OR_RETURN(TensorView t, names_.get(stored));
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
    return unimplemented(where + " is " + dtype_name(t.dtype) + "; only F32 / BF16 / F16 matrices can be split");
  if (t.rank != 2 || t.shape[0] != split.units * split.rows_per_unit)
    return invalid_argument(where + " has shape " + t.shape_string() + ", expected " +
                            std::to_string(split.units * split.rows_per_unit) + " rows to split");
  if (shard_.count(split.units) == 0)
    return failed_precondition(where + ": " + std::to_string(split.units) + " units cannot give each of " +
                               std::to_string(shard_.world) + " ranks one");
  const int64_t row0 = shard_.begin(split.units) * split.rows_per_unit;
  TensorView part = t;
  part.data = static_cast<char*>(t.data) + row0 * t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
  part.shape[0] = shard_.count(split.units) * split.rows_per_unit;
  return part;
}

}  // namespace kiln::glm5_next
