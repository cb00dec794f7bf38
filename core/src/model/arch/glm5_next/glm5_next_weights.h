// The weights of a glm5_next model for the CPU forward pass, resolved once at load: projections and experts
// through the recipe's WeightFormat, the small tensors the model computes with in fp32 (norms, the router and its
// correction bias, the short conv, dt_bias, A_log, the mHC maps, the k-pool ape and compress gate) as fp32 copies.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/weight_format.h"
#include "model/arch/glm5_next/glm5_next_config.h"
#include "model/model_weights.h"
#include "model/precision.h"
#include "model/tensor_shard.h"

namespace kiln::glm5_next {

// One hyper-connection site (attn_hc or ffn_hc): fn [(2 + S)·S, S·hidden], base [(2 + S)·S], scale [3].
struct MhcWeights {
  std::vector<float> fn, base, scale;
};

struct KdaWeights {
  std::unique_ptr<Linear> qkv;       // q_proj, k_proj, v_proj stacked: [3·H·dk, hidden]
  std::vector<float> conv;           // [3·H·dk, kernel] depthwise, weight[c, kernel − 1] on the current token
  std::unique_ptr<Linear> f_a, f_b;  // forget gate: hidden → dk → H·dk
  std::vector<float> dt_bias;        // [H·dk]
  std::vector<float> a_log;          // [H]
  std::unique_ptr<Linear> b_proj;    // hidden → H (β)
  std::unique_ptr<Linear> g_a, g_b;  // output gate: hidden → dv → H·dv
  std::vector<float> o_norm;         // [dv], shared by the heads
  std::unique_ptr<Linear> o_proj;    // H·dv → hidden
};

struct PooledIndexerWeights {
  std::unique_ptr<Linear> wq_b, wk, weights_proj;
  std::vector<float> k_norm_weight, k_norm_bias;
  std::vector<float> ape;            // index_kpool_compress_ape [pool, D]
  std::vector<float> compress_gate;  // index_kpool_compress_gate [D, hidden]
};

struct DsaWeights {
  std::unique_ptr<Linear> q_a, q_b, kv_a, kv_b, o_proj;
  std::vector<float> q_a_norm, kv_a_norm;
  std::vector<float> kv_b_f32;                    // kv_b as fp32 [H·(nope + v), latent], for the absorbed form
  std::unique_ptr<PooledIndexerWeights> indexer;  // layers whose indexer is not shared
  // Attends to every earlier token: a next-n DSA layer stored without an indexer (no selection to follow).
  bool dense = false;
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;
  bool hyper_connections = true;  // attn_hc / ffn_hc over hc_mult streams, else a plain pre-norm residual
  MhcWeights attn_hc, ffn_hc;
  std::unique_ptr<KdaWeights> kda;  // exactly one of kda / dsa
  std::unique_ptr<DsaWeights> dsa;
  bool is_moe = false;
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // sparse layers (router, correction bias, experts, shared expert)
};

// A next-n (MTP) layer, DeepSeek style: x = eh_proj(cat(enorm(embed(t)), hnorm(h))), one decoder layer of the
// kind its names show (MtpLayerLayout), then shared_head.norm and the head.
struct MtpLayerWeights {
  std::vector<float> enorm, hnorm, head_norm;
  std::unique_ptr<Linear> eh_proj;  // [hidden, 2·hidden], the embedding's half first
  std::unique_ptr<Linear> head;     // shared_head.head; null: the trunk's lm_head
  LayerWeights layer;
};

struct Glm5NextWeights {
  // Tensor parallelism: which part this rank holds (glm5_next_sharded_source.h). Sharded, the split modules have this
  // rank's shapes: embed_tokens / lm_head its vocabulary rows, DSA q_b / kv_b and KDA q / k / v / f_b / g_b / b_proj
  // (and the short conv, dt_bias, A_log) its heads, dense and shared-expert gate / up its intermediate columns, and
  // the MoE its routed experts [shard.begin(E), shard.end(E)) numbered from 0.
  TensorShard shard;
  TensorView embed_tokens;  // [vocab, hidden] as stored; rows widened on lookup
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
  std::unique_ptr<Linear> lm_head;
  std::vector<MtpLayerWeights> mtp;  // config.mtp's layers, when asked for
  // The source the format loaded from (the checkpoint seen through its tensor names): kept as long as the weights,
  // for formats that hold on to their source.
  std::shared_ptr<const WeightSource> names;
  std::shared_ptr<const WeightSource> sharded;  // a tensor-parallel rank's view of `names`
  // bf16 precision: `names` rounded to bf16 (what the projections, experts, bf16 norms and embedding came from).
  std::shared_ptr<const WeightSource> rounded;
};

// A KDA layer's short conv [3·H·dk, kernel] fp32 from `<prefix>.conv1d.weight` or the original per-part
// q_conv1d / k_conv1d / v_conv1d (source: the checkpoint seen through Glm5NextTensorNames).
Result<std::vector<float>> load_glm5_next_short_conv(const Glm5NextConfig& config, const WeightSource& source,
                                                     const std::string& prefix);

// Every trunk layer through `format`, from a checkpoint in any of the naming schemes Glm5NextTensorNames reads, and
// with `load_mtp` the next-n layers config.mtp lists. Errors name the missing or misshapen tensor.
// bf16 precision: the weights the CUDA runner holds in bf16 are rounded to it (projections, experts — also
// kept as per-expert Linears —, the RMSNorm weights, the embedding); those it keeps in fp32 are not.
// A sharded `shard`: only this tensor-parallel rank's part (Glm5NextWeights::shard).
Result<Glm5NextWeights> load_glm5_next_weights(const Glm5NextConfig& config, const WeightSource& checkpoint,
                                               WeightFormat& format, bool load_mtp = false,
                                               Precision precision = Precision::kFp32, TensorShard shard = {});

}  // namespace kiln::glm5_next
