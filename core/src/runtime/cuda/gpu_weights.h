// The weights of an MLA + MoE model on one CUDA device: projections and experts through the recipe's WeightFormat
// (Linear / ExpertSet objects on the device: dense bf16 for the built-in format, whatever a plugin stores), and the
// small tensors the model's own kernels read — norms (bf16), the MoE router (fp32, as the gate runs in fp32), the
// DSA indexer's key LayerNorm (fp32), the embedding table and MLA's kv_b in the dense bf16 form the absorption and
// expansion GEMMs read (the format's own storage when it is dense, else dequantized once at load).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cuda/stream_handle.h"
#include "kiln/weight_format.h"
#include "model/model_config.h"
#include "model/tensor_shard.h"
#include "runtime/cuda/cuda_device_context.h"

namespace kiln::cuda {

// The DSA lightning indexer of a layer that runs its own (glm_moe_dsa).
struct GpuIndexer {
  std::unique_ptr<Linear> wq_b;          // [index_n_heads · index_head_dim, q_lora_rank]
  std::unique_ptr<Linear> wk;            // [index_head_dim, hidden]
  std::unique_ptr<Linear> weights_proj;  // [index_n_heads, hidden]
  const float *k_norm_weight = nullptr, *k_norm_bias = nullptr;  // fp32 [index_head_dim]: the key LayerNorm
};

struct GpuLayer {
  const uint16_t *input_norm = nullptr, *post_attention_norm = nullptr;
  // With q_lora_rank > 0, q_a's rows and then kv_a's stacked in one Linear ([q_lora_rank + kv_lora_rank + rope,
  // hidden]): both read the same normed hidden state, so one launch does both. Without, q_proj and kv_a apart.
  std::unique_ptr<Linear> qkv_a, q_proj, kv_a;
  std::unique_ptr<Linear> q_b, o_proj;
  const uint16_t *q_a_norm = nullptr, *kv_a_norm = nullptr;
  // kv_b as dense bf16 [H · (nope + v), latent]: W_UK of head h is rows h·(nope+v) .. +nope, W_UV the v rows after
  // them; the absorption GEMMs address both as strided batches over heads and the prefill path expands K/V with it.
  // The batch-invariant (skinny) query absorption needs W_UK[h]ᵀ with rows contiguous in k: w_uk_t, bf16
  // [H, L, nope] (H·L·nope·2 bytes a layer, 3.9 MB at GLM-4.7-Flash's shapes).
  std::unique_ptr<Linear> kv_b;
  const uint16_t* kv_b_dense = nullptr;
  const uint16_t* w_uk_t = nullptr;
  std::unique_ptr<GpuIndexer> indexer;  // DSA layers that run their own; other layers reuse the previous selection
  // The q_a / kv_a RMSNorms' eps: HF builds them with the class default 1e-6; glm5_next passes rms_norm_eps.
  float latent_norm_eps = 1e-6f;
  // SwiGLU clamp of the dense MLP, shared and routed experts (glm5_next's swiglu_limit; inf: none).
  float swiglu_limit = std::numeric_limits<float>::infinity();
  bool is_moe = false;
  // The dense MLP, or the shared expert(s) of a MoE layer: gate and up stacked ([2·I, hidden], gate rows first).
  // Under tensor parallelism the dense MLP's gate_up holds this rank's intermediate columns (down all of them: its
  // input is gathered), and the shared expert lives whole on one rank (has_shared there only; see load_gpu_weights).
  std::unique_ptr<Linear> gate_up, down;
  bool has_shared = false;
  const float* router = nullptr;       // fp32 [E, hidden]
  const float* router_bias = nullptr;  // fp32 [E]
  // The router as a sum of `router_terms` bf16 matrices ([terms·E, hidden], term-major), exactly: one term for a
  // bf16 checkpoint, at most three for fp32 values (cpu::bf16_terms says which). The prefill gate runs them as one
  // bf16 tensor-core GEMM over the bf16 input instead of widening it for an fp32 GEMM. 0: not built (no exact terms,
  // or terms · E > hidden: their logits would not fit the gate's scratch rows).
  const uint16_t* router_bf16_terms = nullptr;
  int router_terms = 0;
  std::unique_ptr<ExpertSet> experts;
};

// A next-n (MTP) layer: x = eh_proj(cat(enorm(embed(t)), hnorm(h))), one decoder layer, then shared_head.norm
// and the head (shared_head.head when the checkpoint has one, else the target's lm_head).
struct GpuMtpLayer {
  const uint16_t *enorm = nullptr, *hnorm = nullptr, *head_norm = nullptr;
  std::unique_ptr<Linear> eh_proj;  // [hidden, 2·hidden]: the embedding half first
  std::shared_ptr<Linear> head;
  GpuLayer layer;
};

struct GpuWeights {
  std::shared_ptr<Linear> embed;          // [vocab, hidden]: its rows are the embedding table
  const uint16_t* embed_tokens = nullptr;  // the same as dense bf16, what the gather kernel reads
  std::vector<GpuLayer> layers;
  const uint16_t* final_norm = nullptr;
  std::shared_ptr<Linear> lm_head;        // the embedding's Linear itself when tied
  std::vector<GpuMtpLayer> mtp;           // empty unless asked for (and, from a checkpoint, present)
  size_t bytes = 0;
};

// Loads every layer through `format` (made for this device) from `source` (a synthetic source gives random weights
// of the config's shapes; norms 1, router bias 0). With `load_mtp`, also the next-n layers: those the checkpoint
// holds (HF exports may drop them), or num_nextn_predict_layers of them with random weights. Errors name the tensor.
//
// Tensor parallelism (`shard` of more than one rank): `source` is this rank's ShardedWeightSource, so the modules it
// splits come with this rank's rows — q_b / q_proj and kv_b its heads, the dense MLP's gate / up its intermediate
// columns, the embedding and the heads its vocabulary rows, the routed experts its own, renumbered from 0 — and the
// rest (o_proj, down, kv_a / q_a, norms, router, indexer) whole. The shared expert is the exception: it is not split
// by columns but held whole by shared_expert_rank(shard) alone, read from `whole` (the unsplit checkpoint), so that
// it is computed exactly as on one rank — folded into the routed experts' launches or not — and the ranks' sum of
// the expert outputs (one rank's rows, zeros elsewhere) is exact.
Result<GpuWeights> load_gpu_weights(const ModelConfig& config, const WeightSource& source, WeightFormat& format,
                                    CudaDeviceContext& device, bool load_mtp, TensorShard shard = {},
                                    const WeightSource* whole = nullptr);

}  // namespace kiln::cuda
