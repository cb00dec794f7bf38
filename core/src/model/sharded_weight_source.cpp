#include "model/sharded_weight_source.h"

#include <cstdlib>
#include <string>
#include <utility>

namespace kiln {
namespace {

// "model.layers.3.mlp.experts.5.gate_proj.weight" → the position of "5" and its length, or npos.
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

Status check_tensor_parallel_units(const ModelConfig& c, int world) {
  const std::pair<const char*, int64_t> units[] = {
      {"num_attention_heads", c.num_attention_heads},
      {"vocab_size", c.vocab_size},
      {"n_routed_experts", c.n_routed_experts},
      {"intermediate_size", c.intermediate_size},
      {"moe_intermediate_size × n_shared_experts", c.moe_intermediate_size * c.n_shared_experts}};
  for (const auto& [name, count] : units) {
    const bool used = std::string(name) != "n_routed_experts" || c.n_routed_experts > 0;
    if (used && count > 0 && count < world)
      return invalid_argument("parallel.tensor = " + std::to_string(world) + ": " + c.source + " has " + name + " = " +
                              std::to_string(count) + ", fewer than the ranks that split it");
  }
  return ok_status();
}

int64_t routed_expert_of(const std::string& name) {
  const auto [at, len] = expert_index(name);
  return at == std::string::npos ? -1 : std::strtoll(name.substr(at, len).c_str(), nullptr, 10);
}

TensorRowSplit tensor_row_split(const ModelConfig& c, const std::string& module) {
  if (module == "model.embed_tokens" || module == "lm_head" || module.ends_with(".shared_head.head"))
    return {c.vocab_size, 1};
  if (module.ends_with(".self_attn.q_b_proj") || module.ends_with(".self_attn.q_proj"))
    return {c.num_attention_heads, c.qk_head_dim()};
  if (module.ends_with(".self_attn.kv_b_proj")) return {c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim};
  if (module.ends_with(".mlp.shared_experts.gate_proj") || module.ends_with(".mlp.shared_experts.up_proj"))
    return {c.moe_intermediate_size * c.n_shared_experts, 1};
  if (routed_expert_of(module + ".") < 0 && (module.ends_with(".mlp.gate_proj") || module.ends_with(".mlp.up_proj")))
    return {c.intermediate_size, 1};
  return {};
}

std::optional<std::string> RowShardedSource::stored_name(const std::string& name) const {
  const auto [at, len] = expert_index(name);
  if (at == std::string::npos) return name;
  const int64_t local = std::strtoll(name.substr(at, len).c_str(), nullptr, 10);
  if (local >= shard_.count(n_routed_experts_)) return std::nullopt;
  return name.substr(0, at) + std::to_string(shard_.begin(n_routed_experts_) + local) + name.substr(at + len);
}

bool RowShardedSource::has(const std::string& name) const {
  const std::optional<std::string> stored = stored_name(name);
  return stored && stored_.has(*stored);
}

Result<TensorView> RowShardedSource::get(const std::string& name) const {
  const std::optional<std::string> stored = stored_name(name);
  if (!stored)
    return not_found("tensor parallel rank " + std::to_string(shard_.rank) + " holds " +
                     std::to_string(shard_.count(n_routed_experts_)) + " routed experts; `" + name +
                     "` is not one of them");
  const size_t dot = name.rfind('.');
  const std::string module = dot == std::string::npos ? name : name.substr(0, dot);
  const RowSplit split = row_split(module);
  if (split.units == 0 || !shard_.sharded()) return stored_.get(*stored);
  const std::string where = "tensor parallelism (rank " + std::to_string(shard_.rank) + " of " +
                            std::to_string(shard_.world) + "): `" + name + "`";
  if (name.substr(dot + 1) != "weight")
    return unimplemented(where + " belongs to a module the ranks split by rows, and only dense `.weight` matrices "
                                 "can be split (quantized formats are not sharded yet)");
  KILN_ASSIGN_OR_RETURN(TensorView t, stored_.get(*stored));
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

}  // namespace kiln
