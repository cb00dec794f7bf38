// The weights of a glm5_next model on one CUDA device. Projections and experts go through the recipe's
// WeightFormat; the DSA attention and the MLP / MoE of each layer fill a runtime/cuda GpuLayer, so the MLA + MoE
// blocks of the CUDA runtime run them (with glm5_next's q_a / kv_a norm eps and SwiGLU clamp). Small tensors the
// kernels read in fp32 — the mHC maps, the short conv, dt_bias, A_log, o_norm, the indexer's key LayerNorm, ape
// and compress gate, the router — are uploaded fp32. A synthetic source (model.load = "dummy") gives random
// weights of the config's shapes on the device (norms 1, biases 0).
#pragma once

#include <memory>
#include <vector>

#include "kiln/weight_format.h"
#include "model/arch/glm5_next/glm5_next_config.h"
#include "runtime/cuda/cuda_device_context.h"
#include "model/tensor_shard.h"
#include "runtime/cuda/gpu_weights.h"

namespace kiln::glm5_next::cuda {

// One hyper-connection site: fn [(2 + S)·S, S·hidden], base [(2 + S)·S], scale [3], fp32.
struct MhcGpu {
  const float *fn = nullptr, *base = nullptr, *scale = nullptr;
};

struct KdaGpu {
  std::unique_ptr<Linear> qkv;  // q_proj, k_proj, v_proj stacked [3·H·128, hidden]: q | k | v per token
  std::unique_ptr<Linear> f_a, f_b, b_proj, g_a, g_b, o_proj;
  const float* conv = nullptr;     // [3·H·128, 4]
  const float* dt_bias = nullptr;  // [H·128]
  const float* a_log = nullptr;    // [H]
  const float* o_norm = nullptr;   // [128]
};

struct PooledIndexerGpu {
  std::unique_ptr<Linear> wq_b, wk, weights_proj;
  const float *k_norm_weight = nullptr, *k_norm_bias = nullptr;
  const float* ape = nullptr;            // [pool, 128]
  const float* compress_gate = nullptr;  // [128, hidden]
};

struct LayerGpu {
  kiln::cuda::GpuLayer block;  // input / post-attention norms, DSA attention (no indexer), MLP or MoE
  bool hyper_connections = true;  // false (next-n layers without attn_hc / ffn_hc): a plain pre-norm residual block
  bool dense_attention = false;   // a DSA next-n layer without an indexer of its own: dense causal attention
  MhcGpu attn_hc, ffn_hc;
  std::unique_ptr<KdaGpu> kda;                // KDA layers
  std::unique_ptr<PooledIndexerGpu> indexer;  // DSA layers that run their own indexer
};

// A next-n (MTP) layer: x = eh_proj(cat(enorm(embed(t)), hnorm(h))), one decoder layer of its layout
// (Glm5NextConfig::mtp), then shared_head.norm and its own head or the trunk's lm_head.
struct MtpGpu {
  const uint16_t *enorm = nullptr, *hnorm = nullptr, *head_norm = nullptr;
  std::unique_ptr<Linear> eh_proj;  // [hidden, 2·hidden], the embedding's half first
  std::unique_ptr<Linear> head;     // null: the trunk's lm_head
  LayerGpu layer;
};

struct Glm5NextGpuWeights {
  std::unique_ptr<Linear> embed;           // [vocab, hidden]
  const uint16_t* embed_tokens = nullptr;  // the same as dense bf16, what the gather kernel reads
  std::vector<LayerGpu> layers;
  const uint16_t* final_norm = nullptr;
  std::unique_ptr<Linear> lm_head;
  std::vector<MtpGpu> mtp;  // config.mtp's layers, when asked for
  std::shared_ptr<const WeightSource> names;    // the checkpoint seen through Glm5NextTensorNames
  std::shared_ptr<const WeightSource> sharded;  // tensor parallelism: this rank's view of `names`
  size_t bytes = 0;
};

// With `load_mtp`, also the next-n layers config.mtp lists (none from a synthetic source). With a `shard` of more
// than one rank, that rank's part (Glm5NextShardedSource's split; the shared expert whole on shared_expert_rank):
// its DSA and KDA heads, dense-MLP columns, routed experts and vocabulary rows, the rest whole.
Result<Glm5NextGpuWeights> load_glm5_next_gpu_weights(const Glm5NextConfig& config, const WeightSource& source,
                                                      WeightFormat& format, kiln::cuda::CudaDeviceContext& device,
                                                      bool load_mtp, TensorShard shard = {});

}  // namespace kiln::glm5_next::cuda
