#include "model/arch/glm5_next/glm5_next_mtp_layout.h"

#include <algorithm>
#include <regex>
#include <set>

namespace kiln::glm5_next {
namespace {

// The layer's tensor names below its prefix, in either naming scheme (Glm5NextTensorNames).
struct LayerNames {
  std::set<std::string> leaves;
  bool has(const std::string& leaf) const { return leaves.count(leaf) != 0; }
  bool has_prefix(const std::string& p) const {
    return std::any_of(leaves.begin(), leaves.end(), [&](const std::string& l) { return l.rfind(p, 0) == 0; });
  }
  // "a, b, c" with per-expert names collapsed, for messages.
  std::string listing(const std::string& prefix) const {
    static const std::regex expert(R"(\.experts\.\d+\.)");
    std::set<std::string> shown;
    for (const std::string& l : leaves) shown.insert(prefix + std::regex_replace(l, expert, ".experts.*."));
    std::string out;
    for (const std::string& s : shown) out += (out.empty() ? "" : ", ") + s;
    return out;
  }
};

// Why `n` is no next-n layer kiln runs ("" when it is one), and its layout.
std::string classify(const LayerNames& n, MtpLayerLayout& out) {
  for (const char* leaf : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                           "input_layernorm.weight", "post_attention_layernorm.weight"})
    if (!n.has(leaf)) return std::string("it has no `") + leaf + "`";
  const bool kda = n.has("self_attn.q_proj.weight") &&
                   (n.has("self_attn.forget_gate.A_log") || n.has("self_attn.A_log"));
  const bool dsa = n.has("self_attn.q_a_proj.weight") && n.has("self_attn.kv_a_proj_with_mqa.weight");
  if (kda == dsa)
    return kda ? "its self_attn has both KDA and DSA tensors"
               : "its self_attn is neither KDA (q_proj, A_log) nor DSA (q_a_proj, kv_a_proj_with_mqa)";
  out.attention = kda ? AttentionKind::kKda : AttentionKind::kDsa;
  out.indexer = dsa && n.has_prefix("self_attn.indexer.");
  const bool attn_hc = n.has("attn_hc.fn") || n.has("hc_attn_fn");
  const bool ffn_hc = n.has("ffn_hc.fn") || n.has("hc_ffn_fn");
  if (attn_hc != ffn_hc) return "it has hyper-connection maps for only one of attention and MLP";
  out.hyper_connections = attn_hc;
  const bool moe = n.has("mlp.gate.weight") || n.has_prefix("mlp.experts.");
  const bool dense = n.has("mlp.gate_proj.weight");
  if (moe == dense) return moe ? "its mlp has both MoE and dense tensors" : "its mlp is neither MoE nor dense";
  out.moe = moe;
  out.own_head = n.has("shared_head.head.weight");
  return "";
}

}  // namespace

void read_mtp_layouts(const std::vector<std::string>& names, Glm5NextConfig& c) {
  c.mtp.clear();
  c.mtp_refusal.clear();
  const bool nested = std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.rfind("model.language_model.layers.", 0) == 0;
  });
  const std::string trunk = nested ? "model.language_model.layers." : "model.layers.";
  for (int64_t i = 0; !c.num_nextn_predict_layers_given || i < c.num_nextn_predict_layers; ++i) {
    const std::string prefix = trunk + std::to_string(c.num_hidden_layers + i) + ".";
    LayerNames layer;
    for (const std::string& n : names)
      if (n.rfind(prefix, 0) == 0) layer.leaves.insert(n.substr(prefix.size()));
    if (layer.leaves.empty()) return;  // not stored (Hugging Face exports drop it)
    MtpLayerLayout layout;
    const std::string why = classify(layer, layout);
    if (!why.empty()) {
      c.mtp_refusal = "next-n (MTP) layer `" + prefix + "*` has a layout kiln does not know: " + why +
                      ". Its tensors: " + layer.listing(prefix);
      return;
    }
    c.mtp.push_back(layout);
  }
}

}  // namespace kiln::glm5_next
