// The weights of an MLA + MoE model (glm4_moe_lite, glm_moe_dsa, deepseek_v3) for the CPU model, resolved once at
// load: projections and experts through the recipe's WeightFormat (made for the CPU), small vectors (norms, router)
// as fp32 copies.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/weight_format.h"
#include "model/model_config.h"
#include "model/precision.h"
#include "model/tensor_shard.h"

namespace kiln {

struct MlpWeights {
  std::unique_ptr<Linear> gate, up, down;
};

struct IndexerWeights {
  std::unique_ptr<Linear> wq_b, wk, weights_proj;
  std::vector<float> k_norm_weight, k_norm_bias;
};

struct AttentionWeights {
  std::unique_ptr<Linear> q_proj;        // only without q compression (q_lora_rank = 0)
  std::unique_ptr<Linear> q_a, q_b;      // with q compression
  std::vector<float> q_a_norm;
  std::unique_ptr<Linear> kv_a;          // → [kv_lora_rank + qk_rope_head_dim]
  std::vector<float> kv_a_norm;
  std::unique_ptr<Linear> kv_b;          // latent → per head [nope + v]
  std::vector<float> kv_b_f32;           // the same as fp32 [H·(nope + v), latent], for absorption
  std::unique_ptr<Linear> o_proj;
  std::unique_ptr<IndexerWeights> indexer;  // DSA layers that run their own indexer
};

struct MoeWeights {
  std::vector<float> router;        // [experts, hidden] fp32 (the gate runs in fp32)
  std::vector<float> router_bias;   // e_score_correction_bias [experts]
  std::unique_ptr<ExpertSet> experts;  // fp32 precision
  // bf16 precision: each routed expert as three Linears (experts is null), so the model can round the SwiGLU
  // output between gate_up and down as the GPU's expert kernels do; ExpertSet::forward has no such point.
  std::vector<MlpWeights> expert_mlps;
  MlpWeights shared;                // absent (null gate) when n_shared_experts = 0
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;
  AttentionWeights attn;
  bool is_moe = false;
  MlpWeights mlp;   // dense layers
  MoeWeights moe;   // MoE layers
};

// The next-n prediction (MTP) layer: a decoder layer fed cat(enorm(embed(t+1)), hnorm(h_t)) through eh_proj.
struct MtpWeights {
  std::vector<float> enorm, hnorm, head_norm;
  std::unique_ptr<Linear> eh_proj;
  std::unique_ptr<Linear> head;  // shared_head.head when the checkpoint has one, else the target's lm_head
  LayerWeights layer;
};

struct ModelWeights {
  TensorView embed_tokens;  // [vocab rows of this rank, hidden] as stored (mmap); rows converted on lookup
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
  std::unique_ptr<Linear> lm_head;
  std::vector<MtpWeights> mtp;  // empty when the checkpoint has no MTP weights
  Precision precision = Precision::kFp32;
  // This rank's part (tensor parallelism): its heads, intermediate columns, routed experts and vocabulary rows
  // (ShardedWeightSource); o_proj and down_proj are whole on every rank.
  TensorShard shard;
  // bf16 precision: the rounded tensors the views above point into (a Bf16WeightSource).
  std::shared_ptr<const WeightSource> rounded;
};

// Loads every target layer (and MTP layers when `load_mtp` and present) for `precision`. Errors name the tensor.
// With a sharded `shard`, `source` is that rank's ShardedWeightSource and the split modules have this rank's shapes
// (ModelWeights::shard records the split).
Result<ModelWeights> load_model_weights(const ModelConfig& config, const WeightSource& source, WeightFormat& format,
                                        bool load_mtp, Precision precision = Precision::kFp32,
                                        TensorShard shard = {});

// Copies a 1-D or 2-D tensor to fp32, checking its shape.
Result<std::vector<float>> load_f32(const WeightSource& source, const std::string& name,
                                    std::initializer_list<int64_t> shape);

}  // namespace kiln
