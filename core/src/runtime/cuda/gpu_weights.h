// The weights of an MLA + MoE model in device memory, bf16 (router fp32, as the gate runs in fp32), uploaded
// from the checkpoint or, for benchmarks, generated on the device with the config's shapes (model.load = "dummy").
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/stream_handle.h"
#include "kiln/weight_format.h"
#include "model/model_config.h"
#include "runtime/cuda/device_arena.h"

namespace kiln::cuda {

struct GpuLinear {
  const uint16_t* w = nullptr;  // bf16 [out, in], nn.Linear's layout
  int64_t in = 0, out = 0;
};

// The DSA lightning indexer of a layer that runs its own (glm_moe_dsa).
struct GpuIndexer {
  GpuLinear wq_b;          // [index_n_heads · index_head_dim, q_lora_rank]
  GpuLinear wk;            // [index_head_dim, hidden]
  GpuLinear weights_proj;  // [index_n_heads, hidden]
  const float *k_norm_weight = nullptr, *k_norm_bias = nullptr;  // fp32 [index_head_dim]: the key LayerNorm
};

struct GpuLayer {
  const uint16_t *input_norm = nullptr, *post_attention_norm = nullptr;
  GpuLinear q_a, q_b, q_proj, kv_a, kv_b, o_proj;
  // With q_lora_rank > 0, q_a's rows and then kv_a's in one buffer ([q_lora_rank + kv_lora_rank + rope, hidden];
  // q_a and kv_a point into it): both read the same normed hidden state, so one GEMM launch does both.
  GpuLinear qkv_a;
  const uint16_t *q_a_norm = nullptr, *kv_a_norm = nullptr;
  bool has_indexer = false;  // DSA: runs its own indexer; other layers of a DSA model reuse the previous selection
  GpuIndexer indexer;
  // kv_b is [H, nope + v, L]: W_UK of head h is rows h·(nope+v) .. +nope, W_UV the v rows after them; the
  // absorption GEMMs address both as strided batches over heads. The batch-invariant (skinny) query absorption
  // needs W_UK[h]ᵀ with rows contiguous in k: w_uk_t, bf16 [H, L, nope] (H·L·nope·2 bytes a layer, 3.9 MB at
  // GLM-4.7-Flash's shapes).
  const uint16_t* w_uk_t = nullptr;
  bool is_moe = false;
  GpuLinear gate_up, down;  // the dense MLP, or the shared expert(s) of a MoE layer ([2·I, hidden], gate rows first)
  bool has_shared = false;
  const float* router = nullptr;       // fp32 [E, hidden]
  const float* router_bias = nullptr;  // fp32 [E]
  const uint16_t* experts_gate_up = nullptr;  // [E, 2·moe_inter, hidden]
  const uint16_t* experts_down = nullptr;     // [E, hidden, moe_inter]
};

// A next-n (MTP) layer: x = eh_proj(cat(enorm(embed(t)), hnorm(h))), one decoder layer, then shared_head.norm
// and the head (shared_head.head when the checkpoint has one, else the target's lm_head).
struct GpuMtpLayer {
  const uint16_t *enorm = nullptr, *hnorm = nullptr, *head_norm = nullptr;
  GpuLinear eh_proj;  // [hidden, 2·hidden]: the embedding half first
  GpuLinear head;
  GpuLayer layer;
};

struct GpuWeights {
  const uint16_t* embed_tokens = nullptr;  // [vocab, hidden]
  std::vector<GpuLayer> layers;
  const uint16_t* final_norm = nullptr;
  GpuLinear lm_head;
  std::vector<GpuMtpLayer> mtp;  // empty unless asked for (and, from a checkpoint, present)
  size_t bytes = 0;
};

// source == nullptr: dummy weights (uniform with std 0.02, HF's default initializer_range; norms 1, router bias 0),
// generated on `stream` from `seed`. With `load_mtp`, also the next-n layers: those the checkpoint holds (HF
// exports may drop them), or num_nextn_predict_layers of them with dummy weights. Errors name the tensor.
Result<GpuWeights> load_gpu_weights(const ModelConfig& config, const WeightSource* source, DeviceArena& arena,
                                    uint64_t seed, StreamHandle stream, bool load_mtp = false);

}  // namespace kiln::cuda
