#include "model/arch/glm5_next/glm5_next_weight_inventory.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace kiln::glm5_next {
namespace {

// Mirrors the loaders' Loader::layer / kda / dsa / indexer / mlp / moe / mtp, tensor for tensor.
struct Lister {
  const Glm5NextConfig& c;
  WeightInventory& inv;

  void add(std::string name, int64_t out, int64_t in, WeightHeld held, int64_t count = 1) {
    inv.items.push_back({std::move(name), out, in, count, held});
  }
  void linear(const std::string& name, int64_t in, int64_t out) { add(name + ".weight", out, in, WeightHeld::kFormat); }

  void mhc(const std::string& p) {
    const int64_t s = c.hc_mult, mix = (2 + s) * s;
    add(p + ".fn", mix, s * c.hidden_size, WeightHeld::kFp32);
    add(p + ".base", mix, 1, WeightHeld::kFp32);
    add(p + ".scale", 3, 1, WeightHeld::kFp32);
  }

  void kda(const std::string& p) {
    const int64_t hidden = c.hidden_size, h = c.linear_num_heads, d = c.linear_head_dim, ch = c.kda_channels();
    for (const char* part : {".q_proj", ".k_proj", ".v_proj"}) linear(p + part, hidden, ch);
    add(p + ".conv1d.weight", 3 * ch, c.linear_conv_kernel_dim, WeightHeld::kFp32);
    linear(p + ".forget_gate.f_a_proj", hidden, d);
    linear(p + ".forget_gate.f_b_proj", d, ch);
    add(p + ".forget_gate.dt_bias", ch, 1, WeightHeld::kFp32);
    add(p + ".forget_gate.A_log", h, 1, WeightHeld::kFp32);
    linear(p + ".b_proj", hidden, h);
    linear(p + ".g_a_proj", hidden, d);
    linear(p + ".g_b_proj", d, ch);
    add(p + ".o_norm.weight", d, 1, WeightHeld::kFp32);
    linear(p + ".o_proj", ch, hidden);
  }

  void dsa(const std::string& p, bool with_indexer) {
    const int64_t hidden = c.hidden_size, heads = c.num_attention_heads, latent = c.kv_lora_rank;
    linear(p + ".q_a_proj", hidden, c.q_lora_rank);
    add(p + ".q_a_layernorm.weight", c.q_lora_rank, 1, WeightHeld::kNorm);
    linear(p + ".q_b_proj", c.q_lora_rank, heads * c.qk_nope_head_dim);
    linear(p + ".kv_a_proj_with_mqa", hidden, latent);
    add(p + ".kv_a_layernorm.weight", latent, 1, WeightHeld::kNorm);
    linear(p + ".kv_b_proj", latent, heads * (c.qk_nope_head_dim + c.v_head_dim));
    linear(p + ".o_proj", heads * c.v_head_dim, hidden);
    ++inv.dsa_layers;
    if (!with_indexer) return;
    const std::string x = p + ".indexer";
    const int64_t dim = c.index_head_dim;
    linear(x + ".wq_b", c.q_lora_rank, c.index_n_heads * dim);
    linear(x + ".wk", hidden, dim);
    linear(x + ".weights_proj", hidden, c.index_n_heads);
    add(x + ".k_norm.weight", dim, 1, WeightHeld::kFp32);
    add(x + ".k_norm.bias", dim, 1, WeightHeld::kFp32);
    add(x + ".index_kpool_compress_ape", c.index_kpool, dim, WeightHeld::kFp32);
    add(x + ".index_kpool_compress_gate", dim, hidden, WeightHeld::kFp32);
  }

  void mlp(const std::string& p, int64_t inter) {
    linear(p + ".gate_proj", c.hidden_size, inter);
    linear(p + ".up_proj", c.hidden_size, inter);
    linear(p + ".down_proj", inter, c.hidden_size);
  }

  void moe(const std::string& p) {
    const int64_t E = c.n_routed_experts, hidden = c.hidden_size, inter = c.moe_intermediate_size;
    add(p + ".gate.weight", E, hidden, WeightHeld::kFp32);
    add(p + ".gate.e_score_correction_bias", E, 1, WeightHeld::kFp32);
    add(p + ".experts.{e}.gate_proj.weight", inter, hidden, WeightHeld::kFormat, E);
    add(p + ".experts.{e}.up_proj.weight", inter, hidden, WeightHeld::kFormat, E);
    add(p + ".experts.{e}.down_proj.weight", hidden, inter, WeightHeld::kFormat, E);
    if (c.n_shared_experts > 0) mlp(p + ".shared_experts", inter * c.n_shared_experts);
  }

  void layer(const std::string& p, bool is_kda, bool indexer, bool is_moe, bool hyper_connections) {
    add(p + ".input_layernorm.weight", c.hidden_size, 1, WeightHeld::kNorm);
    add(p + ".post_attention_layernorm.weight", c.hidden_size, 1, WeightHeld::kNorm);
    if (hyper_connections) {
      mhc(p + ".attn_hc");
      mhc(p + ".ffn_hc");
    }
    if (is_kda)
      kda(p + ".self_attn");
    else
      dsa(p + ".self_attn", indexer);
    if (is_moe)
      moe(p + ".mlp");
    else
      mlp(p + ".mlp", c.intermediate_size);
  }
};

}  // namespace

std::string WeightItem::name_of(int64_t e) const {
  const size_t at = name.find("{e}");
  return at == std::string::npos ? name : name.substr(0, at) + std::to_string(e) + name.substr(at + 3);
}

WeightInventory glm5_next_weight_inventory(const Glm5NextConfig& c, const std::string& prefix, bool with_mtp) {
  WeightInventory inv;
  inv.kv_b_numel = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank;
  inv.w_uk_numel = c.num_attention_heads * c.kv_lora_rank * c.qk_nope_head_dim;
  Lister l{c, inv};
  l.add(prefix + "embed_tokens.weight", c.vocab_size, c.hidden_size, WeightHeld::kEmbedding);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    l.layer(prefix + "layers." + std::to_string(i), c.is_kda(i), c.runs_indexer(i), c.moe[i], true);
  l.add(prefix + "norm.weight", c.hidden_size, 1, WeightHeld::kNorm);
  // A tied head is loaded as a linear over the embedding: the CUDA format uploads it a second time.
  l.linear(c.tie_word_embeddings ? prefix + "embed_tokens" : "lm_head", c.hidden_size, c.vocab_size);
  if (with_mtp)
    for (size_t i = 0; i < c.mtp.size(); ++i) {
      const MtpLayerLayout& m = c.mtp[i];
      const std::string p = prefix + "layers." + std::to_string(c.num_hidden_layers + static_cast<int64_t>(i));
      for (const char* norm : {".enorm.weight", ".hnorm.weight", ".shared_head.norm.weight"})
        l.add(p + norm, c.hidden_size, 1, WeightHeld::kNorm);
      l.linear(p + ".eh_proj", 2 * c.hidden_size, c.hidden_size);
      if (m.own_head) l.linear(p + ".shared_head.head", c.hidden_size, c.vocab_size);
      l.layer(p, m.attention == AttentionKind::kKda, m.indexer, m.moe, m.hyper_connections);
    }
  return inv;
}

std::vector<WeightItem> glm5_next_vision_inventory(const nlohmann::json& config) {
  std::vector<WeightItem> items;
  if (!config.is_object() || !config.contains("vision_config") || !config["vision_config"].is_object()) return items;
  const nlohmann::json& v = config["vision_config"];
  // An estimate for the memory model: a value no tower has (negative, past 2^20) counts as absent, so a hostile
  // config cannot make it loop or overflow (the tower's loader refuses such a config with its reasons).
  auto get = [&](const char* key, int64_t fallback) {
    if (!v.contains(key)) return fallback;
    const nlohmann::json& x = v[key];  // patch sizes may be given as [n, n]
    const nlohmann::json& n = x.is_array() && !x.empty() ? x[0] : x;
    if (!n.is_number_integer()) return fallback;
    const int64_t value = n.get<int64_t>();
    return value >= 0 && value <= (int64_t{1} << 20) ? value : fallback;
  };
  const int64_t depth = get("depth", 24), h = get("hidden_size", 1024), heads = get("num_heads", 16);
  const int64_t inter = get("intermediate_size", 4096), out = get("out_hidden_size", 1536);
  const int64_t pi = get("projection_intermediate_size", 10240), channels = get("in_channels", 3);
  const int64_t ps = get("patch_size", 14), tps = get("temporal_patch_size", 2), m = get("spatial_merge_size", 2);
  const bool bias =
      !v.contains("attention_bias") || !v["attention_bias"].is_boolean() || v["attention_bias"].get<bool>();
  const std::string p = "model.visual.";
  auto add = [&](std::string name, int64_t o, int64_t i) {
    items.push_back({std::move(name), o, i, 1, WeightHeld::kFp32});
  };
  add(p + "patch_embed.proj.weight", h, channels * tps * ps * ps);
  add(p + "patch_embed.proj.bias", h, 1);
  for (int64_t i = 0; i < depth; ++i) {
    const std::string b = p + "blocks." + std::to_string(i) + ".";
    add(b + "norm1.weight", h, 1);
    add(b + "norm2.weight", h, 1);
    add(b + "attn.qkv.weight", 3 * h, h);
    add(b + "attn.q_norm.weight", h / std::max<int64_t>(heads, 1), 1);
    add(b + "attn.k_norm.weight", h / std::max<int64_t>(heads, 1), 1);
    add(b + "attn.proj.weight", h, h);
    add(b + "mlp.gate_proj.weight", inter, h);
    add(b + "mlp.up_proj.weight", inter, h);
    add(b + "mlp.down_proj.weight", h, inter);
    if (bias) {  // the attention and the block's MLP share the flag
      add(b + "attn.qkv.bias", 3 * h, 1);
      add(b + "attn.proj.bias", h, 1);
      add(b + "mlp.gate_proj.bias", inter, 1);
      add(b + "mlp.up_proj.bias", inter, 1);
      add(b + "mlp.down_proj.bias", h, 1);
    }
  }
  add(p + "post_layernorm.weight", h, 1);
  add(p + "downsample.weight", out, h * m * m);
  add(p + "downsample.bias", out, 1);
  add(p + "merger.proj.weight", out, out);
  add(p + "merger.post_projection_norm.weight", out, 1);
  add(p + "merger.post_projection_norm.bias", out, 1);
  add(p + "merger.gate_proj.weight", pi, out);
  add(p + "merger.up_proj.weight", pi, out);
  add(p + "merger.down_proj.weight", out, pi);
  return items;
}

}  // namespace kiln::glm5_next
