#include "model/arch/glm5_next/glm5_next_weights.h"

#include <string>

#include "model/arch/glm5_next/glm5_next_sharded_source.h"
#include "model/arch/glm5_next/glm5_next_tensor_names.h"
#include "model/bf16_weight_source.h"

namespace kiln::glm5_next {
namespace {

// `src` serves what the GPU holds in bf16 (projections, experts, the bf16 norms, the embedding): rounded in bf16
// precision. `exact` serves what it keeps in fp32 (mHC maps, the short conv, dt_bias, A_log, o_norm, the indexer's
// key LayerNorm, ape and compress gate, the router).
struct Loader {
  const Glm5NextConfig& c;
  const WeightSource& src;
  const WeightSource& exact;
  WeightFormat& format;
  bool bf16 = false;
  TensorShard shard;  // this rank's heads, columns, experts and vocabulary rows (the sources serve its parts)

  // Modules reading the same input, stacked along the output dimension (one name: a plain projection).
  Result<std::unique_ptr<Linear>> linear(std::vector<std::string> names, std::vector<int64_t> outs, int64_t in) const {
    LinearSpec spec;
    spec.names = names;
    spec.out_features = outs;
    spec.in_features = in;
    KILN_ASSIGN_OR_RETURN(auto l, format.load_linear(src, spec));
    if (l->in_features() != in || l->out_features() != spec.total_out())
      return invalid_argument("`" + names[0] + "` is [" + std::to_string(l->out_features()) + ", " +
                              std::to_string(l->in_features()) + "], the config implies [" +
                              std::to_string(spec.total_out()) + ", " + std::to_string(in) + "] (" + c.source + ")");
    return l;
  }
  Result<std::unique_ptr<Linear>> linear(const std::string& name, int64_t in, int64_t out) const {
    return linear(std::vector<std::string>{name}, std::vector<int64_t>{out}, in);
  }
  // A norm the GPU stores in bf16.
  Result<std::vector<float>> f32(const std::string& name, std::initializer_list<int64_t> shape) const {
    return load_f32(src, name, shape);
  }
  // A tensor the GPU keeps in fp32.
  Result<std::vector<float>> exact_f32(const std::string& name, std::initializer_list<int64_t> shape) const {
    return load_f32(exact, name, shape);
  }

  Result<MhcWeights> mhc(const std::string& p) const {
    const int64_t s = c.hc_mult, mix = (2 + s) * s;
    MhcWeights m;
    KILN_ASSIGN_OR_RETURN(m.fn, exact_f32(p + ".fn", {mix, s * c.hidden_size}));
    KILN_ASSIGN_OR_RETURN(m.base, exact_f32(p + ".base", {mix}));
    KILN_ASSIGN_OR_RETURN(m.scale, exact_f32(p + ".scale", {3}));
    return m;
  }

  Result<std::vector<float>> short_conv(const std::string& p) const { return load_glm5_next_short_conv(c, exact, p); }

  Result<std::unique_ptr<KdaWeights>> kda(const std::string& p) const {
    const int64_t hidden = c.hidden_size, h = c.linear_num_heads, d = c.linear_head_dim, ch = c.kda_channels();
    // This rank's heads [h0, h0 + hl): their channels [h0·d, (h0 + hl)·d) of each of q, k, v.
    const int64_t h0 = shard.begin(h), hl = shard.count(h), c0 = h0 * d, cl = hl * d;
    auto k = std::make_unique<KdaWeights>();
    KILN_ASSIGN_OR_RETURN(k->qkv, linear({p + ".q_proj", p + ".k_proj", p + ".v_proj"}, {cl, cl, cl}, hidden));
    KILN_ASSIGN_OR_RETURN(std::vector<float> conv, short_conv(p));
    const int64_t width = c.linear_conv_kernel_dim;
    for (int64_t part = 0; part < 3; ++part)  // q, k, v: each its heads' rows of [ch, width]
      k->conv.insert(k->conv.end(), conv.begin() + (part * ch + c0) * width, conv.begin() + (part * ch + c0 + cl) * width);
    KILN_ASSIGN_OR_RETURN(k->f_a, linear(p + ".forget_gate.f_a_proj", hidden, d));
    KILN_ASSIGN_OR_RETURN(k->f_b, linear(p + ".forget_gate.f_b_proj", d, cl));
    KILN_ASSIGN_OR_RETURN(std::vector<float> dt_bias, exact_f32(p + ".forget_gate.dt_bias", {ch}));
    k->dt_bias.assign(dt_bias.begin() + c0, dt_bias.begin() + c0 + cl);
    KILN_ASSIGN_OR_RETURN(std::vector<float> a_log, exact_f32(p + ".forget_gate.A_log", {h}));
    k->a_log.assign(a_log.begin() + h0, a_log.begin() + h0 + hl);
    KILN_ASSIGN_OR_RETURN(k->b_proj, linear(p + ".b_proj", hidden, hl));
    KILN_ASSIGN_OR_RETURN(k->g_a, linear(p + ".g_a_proj", hidden, d));
    KILN_ASSIGN_OR_RETURN(k->g_b, linear(p + ".g_b_proj", d, cl));
    KILN_ASSIGN_OR_RETURN(k->o_norm, exact_f32(p + ".o_norm.weight", {d}));
    KILN_ASSIGN_OR_RETURN(k->o_proj, linear(p + ".o_proj", ch, hidden));  // whole: its input is gathered
    return k;
  }

  Result<std::unique_ptr<PooledIndexerWeights>> indexer(const std::string& p) const {
    const int64_t dim = c.index_head_dim;
    auto x = std::make_unique<PooledIndexerWeights>();
    KILN_ASSIGN_OR_RETURN(x->wq_b, linear(p + ".wq_b", c.q_lora_rank, c.index_n_heads * dim));
    KILN_ASSIGN_OR_RETURN(x->wk, linear(p + ".wk", c.hidden_size, dim));
    KILN_ASSIGN_OR_RETURN(x->weights_proj, linear(p + ".weights_proj", c.hidden_size, c.index_n_heads));
    KILN_ASSIGN_OR_RETURN(x->k_norm_weight, exact_f32(p + ".k_norm.weight", {dim}));
    KILN_ASSIGN_OR_RETURN(x->k_norm_bias, exact_f32(p + ".k_norm.bias", {dim}));
    KILN_ASSIGN_OR_RETURN(x->ape, exact_f32(p + ".index_kpool_compress_ape", {c.index_kpool, dim}));
    KILN_ASSIGN_OR_RETURN(x->compress_gate, exact_f32(p + ".index_kpool_compress_gate", {dim, c.hidden_size}));
    return x;
  }

  Result<std::unique_ptr<DsaWeights>> dsa(const std::string& p, bool with_indexer) const {
    const int64_t hidden = c.hidden_size, heads = shard.count(c.num_attention_heads), latent = c.kv_lora_rank;
    auto a = std::make_unique<DsaWeights>();
    KILN_ASSIGN_OR_RETURN(a->q_a, linear(p + ".q_a_proj", hidden, c.q_lora_rank));
    KILN_ASSIGN_OR_RETURN(a->q_a_norm, f32(p + ".q_a_layernorm.weight", {c.q_lora_rank}));
    KILN_ASSIGN_OR_RETURN(a->q_b, linear(p + ".q_b_proj", c.q_lora_rank, heads * c.qk_nope_head_dim));
    KILN_ASSIGN_OR_RETURN(a->kv_a, linear(p + ".kv_a_proj_with_mqa", hidden, latent));
    KILN_ASSIGN_OR_RETURN(a->kv_a_norm, f32(p + ".kv_a_layernorm.weight", {latent}));
    KILN_ASSIGN_OR_RETURN(a->kv_b, linear(p + ".kv_b_proj", latent, heads * (c.qk_nope_head_dim + c.v_head_dim)));
    a->kv_b_f32.resize(static_cast<size_t>(a->kv_b->out_features() * latent));
    KILN_RETURN_IF_ERROR(
        a->kv_b
            ->dequantize(TensorView::contiguous(a->kv_b_f32.data(), DType::kF32, {a->kv_b->out_features(), latent}), {})
            .with_context(p + ".kv_b_proj"));
    // Whole: its input (every head's output) is gathered.
    KILN_ASSIGN_OR_RETURN(a->o_proj, linear(p + ".o_proj", c.num_attention_heads * c.v_head_dim, hidden));
    if (with_indexer) {
      KILN_ASSIGN_OR_RETURN(a->indexer, indexer(p + ".indexer"));
    }
    return a;
  }

  // `split`: gate / up hold this rank's intermediate columns (a dense MLP, the shared experts), down all of them.
  Result<MlpWeights> mlp(const std::string& p, int64_t inter, bool split = true) const {
    const int64_t local = split ? shard.count(inter) : inter;
    MlpWeights m;
    KILN_ASSIGN_OR_RETURN(m.gate, linear(p + ".gate_proj", c.hidden_size, local));
    KILN_ASSIGN_OR_RETURN(m.up, linear(p + ".up_proj", c.hidden_size, local));
    KILN_ASSIGN_OR_RETURN(m.down, linear(p + ".down_proj", inter, c.hidden_size));
    return m;
  }

  Result<MoeWeights> moe(const std::string& p) const {
    const int64_t experts = c.n_routed_experts, local = shard.count(experts);  // the source numbers ours from 0
    MoeWeights m;
    KILN_ASSIGN_OR_RETURN(m.router, exact_f32(p + ".gate.weight", {experts, c.hidden_size}));
    KILN_ASSIGN_OR_RETURN(m.router_bias, exact_f32(p + ".gate.e_score_correction_bias", {experts}));
    ExpertSpec spec;
    spec.prefix = p + ".experts";
    spec.num_experts = local;
    spec.hidden = c.hidden_size;
    spec.intermediate = c.moe_intermediate_size;
    KILN_ASSIGN_OR_RETURN(m.experts, format.load_experts(src, spec));
    // bf16 precision: each expert also as three Linears, so the model can round its SwiGLU output as the GPU does.
    for (int64_t e = 0; bf16 && e < local; ++e) {
      KILN_ASSIGN_OR_RETURN(MlpWeights one, mlp(spec.prefix + "." + std::to_string(e), c.moe_intermediate_size, false));
      m.expert_mlps.push_back(std::move(one));
    }
    if (m.experts->hidden_size() != c.hidden_size || m.experts->intermediate_size() != c.moe_intermediate_size)
      return invalid_argument(spec.prefix + ": expert shapes do not match moe_intermediate_size / hidden_size in " +
                              c.source);
    if (c.n_shared_experts > 0) {
      KILN_ASSIGN_OR_RETURN(m.shared, mlp(p + ".shared_experts", c.moe_intermediate_size * c.n_shared_experts));
    }
    return m;
  }

  // One decoder layer of the given structure (a trunk layer's from the config, a next-n layer's from its names).
  Result<LayerWeights> layer(const std::string& p, bool kda, bool indexer, bool moe, bool hyper_connections) const {
    LayerWeights w;
    KILN_ASSIGN_OR_RETURN(w.input_norm, f32(p + ".input_layernorm.weight", {c.hidden_size}));
    KILN_ASSIGN_OR_RETURN(w.post_attention_norm, f32(p + ".post_attention_layernorm.weight", {c.hidden_size}));
    w.hyper_connections = hyper_connections;
    if (hyper_connections) {
      KILN_ASSIGN_OR_RETURN(w.attn_hc, mhc(p + ".attn_hc"));
      KILN_ASSIGN_OR_RETURN(w.ffn_hc, mhc(p + ".ffn_hc"));
    }
    if (kda) {
      KILN_ASSIGN_OR_RETURN(w.kda, this->kda(p + ".self_attn"));
    } else {
      KILN_ASSIGN_OR_RETURN(w.dsa, dsa(p + ".self_attn", indexer));
    }
    w.is_moe = moe;
    if (w.is_moe) {
      KILN_ASSIGN_OR_RETURN(w.moe, this->moe(p + ".mlp"));
    } else {
      KILN_ASSIGN_OR_RETURN(w.mlp, mlp(p + ".mlp", c.intermediate_size));
    }
    return w;
  }

  Result<MtpLayerWeights> mtp(const std::string& p, const MtpLayerLayout& layout) const {
    const int64_t hidden = c.hidden_size;
    MtpLayerWeights m;
    KILN_ASSIGN_OR_RETURN(m.enorm, f32(p + ".enorm.weight", {hidden}));
    KILN_ASSIGN_OR_RETURN(m.hnorm, f32(p + ".hnorm.weight", {hidden}));
    KILN_ASSIGN_OR_RETURN(m.head_norm, f32(p + ".shared_head.norm.weight", {hidden}));
    KILN_ASSIGN_OR_RETURN(m.eh_proj, linear(p + ".eh_proj", 2 * hidden, hidden));
    if (layout.own_head) {
      KILN_ASSIGN_OR_RETURN(m.head, linear(p + ".shared_head.head", hidden, shard.count(c.vocab_size)));
    }
    const bool kda = layout.attention == AttentionKind::kKda;
    KILN_ASSIGN_OR_RETURN(m.layer, layer(p, kda, layout.indexer, layout.moe, layout.hyper_connections));
    if (m.layer.dsa) m.layer.dsa->dense = !layout.indexer;
    return m;
  }
};

}  // namespace

// conv1d.weight [3C, 1, W] in transformers' form; q_conv1d / k_conv1d / v_conv1d [C, 1, W] each in the original.
Result<std::vector<float>> load_glm5_next_short_conv(const Glm5NextConfig& c, const WeightSource& src,
                                                     const std::string& p) {
  const int64_t ch = c.kda_channels(), w = c.linear_conv_kernel_dim;
  if (src.has(p + ".conv1d.weight") || !src.has(p + ".q_conv1d.weight"))
    return load_f32(src, p + ".conv1d.weight", {3 * ch, 1, w});
  std::vector<float> conv;
  for (const char* part : {"q", "k", "v"}) {
    KILN_ASSIGN_OR_RETURN(auto one, load_f32(src, p + "." + part + "_conv1d.weight", {ch, 1, w}));
    conv.insert(conv.end(), one.begin(), one.end());
  }
  return conv;
}

Result<Glm5NextWeights> load_glm5_next_weights(const Glm5NextConfig& c, const WeightSource& checkpoint,
                                               WeightFormat& format, bool load_mtp, Precision precision,
                                               TensorShard shard) {
  Glm5NextWeights w;
  w.shard = shard;
  auto names = std::make_shared<Glm5NextTensorNames>(checkpoint);
  w.names = names;
  if (shard.sharded()) w.sharded = std::make_shared<Glm5NextShardedSource>(*names, c, shard);
  const WeightSource& exact = shard.sharded() ? *w.sharded : *names;
  const bool bf16 = precision == Precision::kBf16;
  if (bf16) w.rounded = std::make_shared<Bf16WeightSource>(exact);
  const WeightSource& src = bf16 ? *w.rounded : exact;
  const std::string prefix = names->trunk_prefix();
  const Loader load{c, src, exact, format, bf16, shard};
  const int64_t vocab = shard.count(c.vocab_size);
  const std::string embed = prefix + "embed_tokens.weight";
  KILN_ASSIGN_OR_RETURN(w.embed_tokens, src.get(embed));
  if (w.embed_tokens.rank != 2 || w.embed_tokens.shape[0] != vocab || w.embed_tokens.shape[1] != c.hidden_size)
    return invalid_argument("tensor `" + embed + "` has shape " + w.embed_tokens.shape_string() + ", expected [" +
                            std::to_string(vocab) + ", " + std::to_string(c.hidden_size) + "]");
  if (w.embed_tokens.dtype != DType::kF32 && w.embed_tokens.dtype != DType::kBF16 &&
      w.embed_tokens.dtype != DType::kF16)
    return invalid_argument("tensor `" + embed + "` has unsupported dtype " +
                            std::string(dtype_name(w.embed_tokens.dtype)));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KILN_ASSIGN_OR_RETURN(LayerWeights layer, load.layer(prefix + "layers." + std::to_string(l), c.is_kda(l),
                                                         c.runs_indexer(l), c.moe[l], true));
    w.layers.push_back(std::move(layer));
  }
  KILN_ASSIGN_OR_RETURN(w.final_norm, load.f32(prefix + "norm.weight", {c.hidden_size}));
  const std::string head = c.tie_word_embeddings && !names->has("lm_head.weight") ? prefix + "embed_tokens" : "lm_head";
  KILN_ASSIGN_OR_RETURN(w.lm_head, load.linear(head, c.hidden_size, vocab));
  if (load_mtp)
    for (size_t i = 0; i < c.mtp.size(); ++i) {
      const std::string p = prefix + "layers." + std::to_string(c.num_hidden_layers + static_cast<int64_t>(i));
      KILN_ASSIGN_OR_RETURN(MtpLayerWeights m, load.mtp(p, c.mtp[i]));
      w.mtp.push_back(std::move(m));
    }
  return w;
}

}  // namespace kiln::glm5_next
