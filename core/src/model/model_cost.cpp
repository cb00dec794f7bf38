#include "model/model_cost.h"

#include <cmath>

namespace kiln {
namespace {

constexpr double kBf16 = 2, kF32 = 4;

// kv_b (latent → per-head nope key and value): what the absorbed decode reads as a bf16 copy in every format.
double kv_b_params(const ModelConfig& c) {
  return static_cast<double>(c.kv_lora_rank) * c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim);
}

// Attention projections of one layer: q (direct, or q_a → q_b), kv_a (latent + rope key), kv_b, o_proj.
double attention_params(const ModelConfig& c) {
  const double Hd = c.hidden_size, H = c.num_attention_heads, L = c.kv_lora_rank, R = c.qk_rope_head_dim;
  const double qk = static_cast<double>(c.qk_head_dim()), vd = c.v_head_dim;
  const double q = c.q_lora_rank > 0 ? Hd * c.q_lora_rank + c.q_lora_rank * H * qk : Hd * H * qk;
  return q + Hd * (L + R) + kv_b_params(c) + H * vd * Hd;
}

double expert_params(const ModelConfig& c) { return 3.0 * c.hidden_size * c.moe_intermediate_size; }
double dense_mlp_params(const ModelConfig& c) { return 3.0 * c.hidden_size * c.intermediate_size; }
double router_params(const ModelConfig& c) { return static_cast<double>(c.hidden_size) * c.n_routed_experts; }

}  // namespace

double expected_distinct_experts(int64_t experts, int64_t top_k, int64_t tokens) {
  if (experts <= 0 || top_k <= 0 || tokens <= 0) return 0;
  const double E = static_cast<double>(experts), k = static_cast<double>(top_k);
  return E * (1.0 - std::pow(1.0 - k / E, static_cast<double>(tokens)));
}

WeightPricing recipe_weight_pricing(const Recipe& recipe, std::string& basis) {
  const RecipeSection& weights = recipe.section("weights");
  WeightPricing p;
  basis = "bf16";
  if (weights.get_string("format", "dense") != "exl3") return p;
  if (recipe.section("model").get_string("load", "mmap") != "dummy") {
    basis = "bf16 (an EXL3 checkpoint's bits per weight are not known before loading)";
    return p;
  }
  const int64_t bits = weights.get_int("bits", 4);
  p.expert_bytes_per_weight = static_cast<double>(bits) / 8.0;
  const bool experts_only = weights.get_bool("experts_only", false);
  if (!experts_only) p.other_bytes_per_weight = p.expert_bytes_per_weight;
  basis = "EXL3 " + std::to_string(bits) + " bits per weight for the routed experts" +
          (experts_only ? ", bf16 for every other linear" : " and every other linear (kv_b's bf16 copy aside)");
  return p;
}

double decode_weight_bytes(const ModelConfig& c, int64_t batch, const WeightPricing& p) {
  const double experts = expected_distinct_experts(c.n_routed_experts, c.num_experts_per_tok, batch);
  const double other = p.other_bytes_per_weight;
  double total = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += (attention_params(c) - kv_b_params(c)) * other + kv_b_params(c) * kBf16;
    if (!c.is_moe(l))
      total += dense_mlp_params(c) * other;
    else
      total += expert_params(c) * (experts * p.expert_bytes_per_weight + c.n_shared_experts * other) +
               router_params(c) * kF32;
  }
  const double Hd = c.hidden_size;
  return total + static_cast<double>(batch) * Hd * kBf16 + static_cast<double>(c.vocab_size) * Hd * other;
}

double decode_kv_bytes(const ModelConfig& c, int64_t batch, double context, double bytes_per_token) {
  if (bytes_per_token <= 0) bytes_per_token = c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * kBf16;
  return static_cast<double>(batch) * context * bytes_per_token;
}

double active_params_per_token(const ModelConfig& c) {
  double total = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += attention_params(c);
    total += c.is_moe(l) ? expert_params(c) * (c.num_experts_per_tok + c.n_shared_experts) + router_params(c)
                         : dense_mlp_params(c);
  }
  return total;
}

double prefill_flops(const ModelConfig& c, int64_t tokens, int64_t chunk) {
  if (tokens <= 0 || chunk <= 0) return 0;
  const double T = static_cast<double>(tokens);
  const double chunks = static_cast<double>((tokens + chunk - 1) / chunk);
  const double keys_seen = T * (T + 1) / 2;
  const double attention = 2.0 * c.num_hidden_layers * c.num_attention_heads *
                           static_cast<double>(c.qk_head_dim() + c.v_head_dim) * keys_seen;
  return 2.0 * active_params_per_token(c) * T + 2.0 * c.hidden_size * static_cast<double>(c.vocab_size) * chunks +
         attention;
}

}  // namespace kiln
