// What one forward pass of an MLA + MoE model must move and compute: the bytes a decode step reads (weights it
// touches + the KV it attends over) and the FLOPs of a prefill. The denominators of the rooflines that `kiln bench
// decode|prefill` print beside their figures. Weights are counted as the CUDA runner holds them: bf16 (or a
// quantized format's bytes per weight, WeightPricing), the router in fp32.
#pragma once

#include <cstdint>
#include <string>

#include "model/model_config.h"
#include "recipe/recipe.h"

namespace kiln {

// Expected number of distinct experts `tokens` tokens touch when each picks `top_k` of `experts` uniformly and
// independently: E · (1 − (1 − k/E)^B). Real routers are not uniform (popular experts are shared more often, so
// fewer distinct ones are touched); uniform routing is what dummy weights give, and the upper end for real ones.
double expected_distinct_experts(int64_t experts, int64_t top_k, int64_t tokens);

// Bytes per weight the decode step's linears are read at: the routed experts and every other linear (dense: bf16
// both; EXL3 at K bits: K / 8, the sign vectors not counted — under 1 % of an expert's bytes). The absorbed attention
// reads kv_b's bf16 copy and the embedding's rows in bf16 whatever the format; the router is fp32.
struct WeightPricing {
  double expert_bytes_per_weight = 2;
  double other_bytes_per_weight = 2;
};

// A recipe's bytes per weight: bf16, or under weights.format = "exl3" with model.load = "dummy" weights.bits / 8 for
// the routed experts and — unless weights.experts_only — every other linear. An EXL3 checkpoint's own bits are not
// known before loading: counted as bf16, and `basis` (what the pricing is, in words) says so.
WeightPricing recipe_weight_pricing(const Recipe& recipe, std::string& basis);

// Weight bytes one decode step of `batch` tokens (one per sequence) reads: attention, the dense MLP layers, per MoE
// layer the shared experts + the expected distinct routed experts (above) + the router, `batch` embedding rows and
// the lm_head.
double decode_weight_bytes(const ModelConfig& config, int64_t batch, const WeightPricing& pricing = {});

// KV bytes one decode step reads when each of `batch` sequences attends over `context` positions:
// batch × context × bytes_per_token, where bytes_per_token is the pool's per token over every caching layer (the KV
// layout's rows plus a DSA indexer's keys, in the layout's formats: kv_bytes_per_token in engine/kv_capacity.h). 0
// takes the bf16 latent rows, layers × (kv_lora_rank + qk_rope_head_dim) × 2.
double decode_kv_bytes(const ModelConfig& config, int64_t batch, double context, double bytes_per_token = 0);

// Parameters one token is multiplied through, outside the embedding lookup and the lm_head: attention, the dense
// MLP or (shared + top-k routed experts + router) of every layer.
double active_params_per_token(const ModelConfig& config);

// Model FLOPs of a prefill of `tokens` tokens from position 0 in chunks of `chunk` (one forward each, logits of
// its last token only): 2 × active params × tokens, + 2 × hidden × vocab per chunk (its one logits row),
// + causal attention 2 · layers · heads · (qk_head_dim + v_head_dim) · Σ keys each query sees (tokens·(tokens+1)/2).
// Attention is counted in the standard (non-absorbed) form whatever the kernels compute.
double prefill_flops(const ModelConfig& config, int64_t tokens, int64_t chunk);

}  // namespace kiln
