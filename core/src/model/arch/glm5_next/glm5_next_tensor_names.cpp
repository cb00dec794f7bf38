#include "model/arch/glm5_next/glm5_next_tensor_names.h"

#include <regex>

namespace kiln::glm5_next {
namespace {

// The original release's leaf names (transformers' conversion mapping for glm5_next, reversed).
const std::vector<std::pair<std::regex, std::string>>& original_renames() {
  static const std::vector<std::pair<std::regex, std::string>> renames = {
      {std::regex(R"(\.self_attn\.forget_gate\.(f_a_proj|f_b_proj|dt_bias|A_log)\b)"), ".self_attn.$1"},
      {std::regex(R"(\.attn_hc\.(fn|base|scale)$)"), ".hc_attn_$1"},
      {std::regex(R"(\.ffn_hc\.(fn|base|scale)$)"), ".hc_ffn_$1"},
  };
  return renames;
}

// "<prefix>.mlp.experts.<e>.<part>_proj.weight" → prefix, e, part.
bool split_expert_name(const std::string& name, std::string& experts, int64_t& e, std::string& part) {
  static const std::regex re(R"((.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return false;
  experts = m[1], e = std::stoll(m[2]), part = m[3];
  return true;
}

// Row block [first, first + rows) of expert e in a stacked [E, R, C] tensor, as a [rows, C] view.
TensorView expert_rows(const TensorView& stacked, int64_t e, int64_t first, int64_t rows) {
  const int64_t cols = stacked.shape[2];
  auto* base = static_cast<char*>(stacked.data) +
               static_cast<size_t>((e * stacked.shape[1] + first) * cols) * dtype_size(stacked.dtype);
  return TensorView::contiguous(base, stacked.dtype, {rows, cols}, stacked.device);
}

}  // namespace

std::string Glm5NextTensorNames::trunk_prefix() const {
  return stored_.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
}

std::vector<std::string> Glm5NextTensorNames::aliases(const std::string& name) const {
  std::vector<std::string> out = {name};
  std::string renamed = name;
  for (const auto& [re, to] : original_renames()) renamed = std::regex_replace(renamed, re, to);
  if (renamed != name) out.push_back(renamed);
  return out;
}

bool Glm5NextTensorNames::has(const std::string& name) const {
  for (const std::string& n : aliases(name))
    if (stored_.has(n)) return true;
  std::string experts, part;
  int64_t e = 0;
  if (split_expert_name(name, experts, e, part))
    return stored_.has(experts + (part == "down" ? ".down_proj" : ".gate_up_proj"));
  return false;
}

Result<TensorView> Glm5NextTensorNames::get(const std::string& name) const {
  const std::vector<std::string> names = aliases(name);
  for (const std::string& n : names)
    if (stored_.has(n)) return stored_.get(n);
  std::string experts, part;
  int64_t e = 0;
  if (split_expert_name(name, experts, e, part)) {
    const std::string stacked_name = experts + (part == "down" ? ".down_proj" : ".gate_up_proj");
    if (stored_.has(stacked_name)) {
      KILN_ASSIGN_OR_RETURN(TensorView stacked, stored_.get(stacked_name));
      if (stacked.rank != 3 || e >= stacked.shape[0] || (part != "down" && stacked.shape[1] % 2 != 0))
        return invalid_argument("tensor `" + stacked_name + "` has shape " + stacked.shape_string() + "; expert " +
                                std::to_string(e) + "'s " + part + "_proj cannot be read from it");
      if (part == "down") return expert_rows(stacked, e, 0, stacked.shape[1]);
      const int64_t inter = stacked.shape[1] / 2;  // rows [0, I) gate, [I, 2I) up
      return expert_rows(stacked, e, part == "gate" ? 0 : inter, inter);
    }
  }
  Status missing = stored_.get(name).status();
  if (names.size() > 1)
    missing = Status(missing.code(), missing.message() + " (nor under its original name `" + names[1] + "`)");
  return missing;
}

}  // namespace kiln::glm5_next
