#include "model/model_weights.h"

#include <algorithm>

#include "kernels/cpu/half_float.h"
#include "model/bf16_weight_source.h"

namespace kiln {
namespace {

// Where a layer's tensors come from. `weights`: projections, experts, norms, the embedding (rounded to bf16 in
// bf16 precision, as the GPU uploads them). `exact`: the MoE router and its bias and the DSA indexer's key
// LayerNorm, which the GPU keeps in fp32.
struct Sources {
  const WeightSource& weights;
  const WeightSource& exact;
  Precision precision;
  TensorShard shard;
};

std::string shape_str(std::initializer_list<int64_t> shape) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : shape) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + "]";
}

Result<std::unique_ptr<Linear>> linear(WeightFormat& f, const WeightSource& src, const std::string& name, int64_t in,
                                       int64_t out) {
  LinearSpec spec;
  spec.names = {name};
  spec.out_features = {out};
  spec.in_features = in;
  KILN_ASSIGN_OR_RETURN(auto l, f.load_linear(src, spec));
  if (l->in_features() != in || l->out_features() != out)
    return invalid_argument("`" + name + "` is [" + std::to_string(l->out_features()) + ", " +
                            std::to_string(l->in_features()) + "], the config implies [" + std::to_string(out) + ", " +
                            std::to_string(in) + "]");
  return l;
}

// gate / up hold this rank's `local` intermediate columns (all of them unsharded); down reads all `inter`.
Result<MlpWeights> load_mlp(WeightFormat& f, const WeightSource& src, const std::string& prefix, int64_t hidden,
                            int64_t inter, int64_t local = -1) {
  if (local < 0) local = inter;
  MlpWeights m;
  KILN_ASSIGN_OR_RETURN(m.gate, linear(f, src, prefix + ".gate_proj", hidden, local));
  KILN_ASSIGN_OR_RETURN(m.up, linear(f, src, prefix + ".up_proj", hidden, local));
  KILN_ASSIGN_OR_RETURN(m.down, linear(f, src, prefix + ".down_proj", inter, hidden));
  return m;
}

Result<AttentionWeights> load_attention(const ModelConfig& c, const Sources& s, WeightFormat& f,
                                        const std::string& p, bool with_indexer) {
  const WeightSource& src = s.weights;
  AttentionWeights a;
  // q and kv_b carry this rank's heads; o_proj reads all heads (gathered).
  const int64_t H = s.shard.count(c.num_attention_heads), hidden = c.hidden_size;
  if (c.q_lora_rank > 0) {
    KILN_ASSIGN_OR_RETURN(a.q_a, linear(f, src, p + ".q_a_proj", hidden, c.q_lora_rank));
    KILN_ASSIGN_OR_RETURN(a.q_a_norm, load_f32(src, p + ".q_a_layernorm.weight", {c.q_lora_rank}));
    KILN_ASSIGN_OR_RETURN(a.q_b, linear(f, src, p + ".q_b_proj", c.q_lora_rank, H * c.qk_head_dim()));
  } else {
    KILN_ASSIGN_OR_RETURN(a.q_proj, linear(f, src, p + ".q_proj", hidden, H * c.qk_head_dim()));
  }
  KILN_ASSIGN_OR_RETURN(a.kv_a, linear(f, src, p + ".kv_a_proj_with_mqa", hidden, c.kv_lora_rank + c.qk_rope_head_dim));
  KILN_ASSIGN_OR_RETURN(a.kv_a_norm, load_f32(src, p + ".kv_a_layernorm.weight", {c.kv_lora_rank}));
  KILN_ASSIGN_OR_RETURN(a.kv_b, linear(f, src, p + ".kv_b_proj", c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim)));
  a.kv_b_f32.resize(static_cast<size_t>(a.kv_b->out_features() * a.kv_b->in_features()));
  KILN_RETURN_IF_ERROR(a.kv_b
                           ->dequantize(TensorView::contiguous(a.kv_b_f32.data(), DType::kF32,
                                                               {a.kv_b->out_features(), a.kv_b->in_features()}),
                                        {})
                           .with_context(p + ".kv_b_proj"));
  KILN_ASSIGN_OR_RETURN(a.o_proj, linear(f, src, p + ".o_proj", c.num_attention_heads * c.v_head_dim, hidden));
  if (with_indexer) {
    auto idx = std::make_unique<IndexerWeights>();
    const std::string ip = p + ".indexer";
    if (c.q_lora_rank <= 0) return invalid_argument(c.source + ": the DSA indexer needs q_lora_rank > 0");
    KILN_ASSIGN_OR_RETURN(idx->wq_b, linear(f, src, ip + ".wq_b", c.q_lora_rank, c.index_n_heads * c.index_head_dim));
    KILN_ASSIGN_OR_RETURN(idx->wk, linear(f, src, ip + ".wk", hidden, c.index_head_dim));
    KILN_ASSIGN_OR_RETURN(idx->weights_proj, linear(f, src, ip + ".weights_proj", hidden, c.index_n_heads));
    KILN_ASSIGN_OR_RETURN(idx->k_norm_weight, load_f32(s.exact, ip + ".k_norm.weight", {c.index_head_dim}));
    KILN_ASSIGN_OR_RETURN(idx->k_norm_bias, load_f32(s.exact, ip + ".k_norm.bias", {c.index_head_dim}));
    a.indexer = std::move(idx);
  }
  return a;
}

Result<LayerWeights> load_layer(const ModelConfig& c, const Sources& s, WeightFormat& f, int64_t layer) {
  const WeightSource& src = s.weights;
  LayerWeights w;
  const std::string p = "model.layers." + std::to_string(layer);
  KILN_ASSIGN_OR_RETURN(w.input_norm, load_f32(src, p + ".input_layernorm.weight", {c.hidden_size}));
  KILN_ASSIGN_OR_RETURN(w.post_attention_norm, load_f32(src, p + ".post_attention_layernorm.weight", {c.hidden_size}));
  bool indexer = c.has_indexer() && !c.indexer_is_shared(layer);
  KILN_ASSIGN_OR_RETURN(w.attn, load_attention(c, s, f, p + ".self_attn", indexer));
  w.is_moe = c.is_moe(layer);
  if (!w.is_moe) {
    KILN_ASSIGN_OR_RETURN(w.mlp, load_mlp(f, src, p + ".mlp", c.hidden_size, c.intermediate_size,
                                          s.shard.count(c.intermediate_size)));
    return w;
  }
  const int64_t E = c.n_routed_experts;
  const int64_t local_experts = s.shard.count(E);  // the source numbers this rank's experts from 0
  KILN_ASSIGN_OR_RETURN(w.moe.router, load_f32(s.exact, p + ".mlp.gate.weight", {E, c.hidden_size}));
  if (src.has(p + ".mlp.gate.e_score_correction_bias")) {
    KILN_ASSIGN_OR_RETURN(w.moe.router_bias, load_f32(s.exact, p + ".mlp.gate.e_score_correction_bias", {E}));
  } else {
    w.moe.router_bias.assign(E, 0.0f);
  }
  if (s.precision == Precision::kBf16) {
    for (int64_t e = 0; e < local_experts; ++e) {
      KILN_ASSIGN_OR_RETURN(MlpWeights m, load_mlp(f, src, p + ".mlp.experts." + std::to_string(e), c.hidden_size,
                                                   c.moe_intermediate_size));
      w.moe.expert_mlps.push_back(std::move(m));
    }
  } else {
    ExpertSpec spec;
    spec.prefix = p + ".mlp.experts";
    spec.num_experts = local_experts;
    spec.hidden = c.hidden_size;
    spec.intermediate = c.moe_intermediate_size;
    KILN_ASSIGN_OR_RETURN(w.moe.experts, f.load_experts(src, spec));
    if (w.moe.experts->hidden_size() != c.hidden_size || w.moe.experts->intermediate_size() != c.moe_intermediate_size)
      return invalid_argument(p + ".mlp.experts: expert shapes do not match moe_intermediate_size / hidden_size in " +
                              c.source);
  }
  if (c.n_shared_experts > 0) {
    const int64_t inter = c.moe_intermediate_size * c.n_shared_experts;
    KILN_ASSIGN_OR_RETURN(w.moe.shared, load_mlp(f, src, p + ".mlp.shared_experts", c.hidden_size, inter,
                                                 s.shard.count(inter)));
  }
  return w;
}

Result<MtpWeights> load_mtp(const ModelConfig& c, const Sources& s, WeightFormat& f, int64_t layer,
                            bool has_own_head) {
  const WeightSource& src = s.weights;
  MtpWeights m;
  const std::string p = "model.layers." + std::to_string(layer);
  KILN_ASSIGN_OR_RETURN(m.enorm, load_f32(src, p + ".enorm.weight", {c.hidden_size}));
  KILN_ASSIGN_OR_RETURN(m.hnorm, load_f32(src, p + ".hnorm.weight", {c.hidden_size}));
  KILN_ASSIGN_OR_RETURN(m.head_norm, load_f32(src, p + ".shared_head.norm.weight", {c.hidden_size}));
  KILN_ASSIGN_OR_RETURN(m.eh_proj, linear(f, src, p + ".eh_proj", 2 * c.hidden_size, c.hidden_size));
  if (has_own_head) {
    KILN_ASSIGN_OR_RETURN(m.head, linear(f, src, p + ".shared_head.head", c.hidden_size, s.shard.count(c.vocab_size)));
  }
  KILN_ASSIGN_OR_RETURN(m.layer, load_layer(c, s, f, layer));
  return m;
}

}  // namespace

Result<std::vector<float>> load_f32(const WeightSource& source, const std::string& name,
                                    std::initializer_list<int64_t> shape) {
  KILN_ASSIGN_OR_RETURN(TensorView t, source.get(name));
  bool match = t.rank == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) match = match && t.shape[i++] == d;
  if (!match) return invalid_argument("tensor `" + name + "` has shape " + t.shape_string() + ", expected " + shape_str(shape));
  std::vector<float> out(static_cast<size_t>(t.numel()));
  switch (t.dtype) {
    case DType::kF32: std::copy_n(t.as<const float>(), out.size(), out.begin()); break;
    case DType::kBF16: cpu::bf16_to_float(t.as<const uint16_t>(), out.data(), t.numel()); break;
    case DType::kF16: cpu::fp16_to_float(t.as<const uint16_t>(), out.data(), t.numel()); break;
    default: return invalid_argument("tensor `" + name + "` has dtype " + dtype_name(t.dtype) + "; expected F32, BF16 or F16");
  }
  return out;
}

Result<ModelWeights> load_model_weights(const ModelConfig& c, const WeightSource& stored, WeightFormat& f,
                                        bool load_mtp_layers, Precision precision, TensorShard shard) {
  ModelWeights w;
  w.precision = precision;
  w.shard = shard;
  if (precision == Precision::kBf16) w.rounded = std::make_shared<Bf16WeightSource>(stored);
  const Sources s{w.rounded ? *w.rounded : stored, stored, precision, shard};
  const int64_t vocab = shard.count(c.vocab_size);
  const WeightSource& src = s.weights;
  KILN_ASSIGN_OR_RETURN(w.embed_tokens, src.get("model.embed_tokens.weight"));
  if (w.embed_tokens.rank != 2 || w.embed_tokens.shape[0] != vocab || w.embed_tokens.shape[1] != c.hidden_size)
    return invalid_argument("tensor `model.embed_tokens.weight` has shape " + w.embed_tokens.shape_string() +
                            ", expected [" + std::to_string(vocab) + ", " + std::to_string(c.hidden_size) + "]");
  if (w.embed_tokens.dtype != DType::kF32 && w.embed_tokens.dtype != DType::kBF16 && w.embed_tokens.dtype != DType::kF16)
    return invalid_argument("tensor `model.embed_tokens.weight` has unsupported dtype " +
                            std::string(dtype_name(w.embed_tokens.dtype)));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KILN_ASSIGN_OR_RETURN(LayerWeights layer, load_layer(c, s, f, l));
    w.layers.push_back(std::move(layer));
  }
  KILN_ASSIGN_OR_RETURN(w.final_norm, load_f32(src, "model.norm.weight", {c.hidden_size}));
  const std::string head = (c.tie_word_embeddings && !src.has("lm_head.weight")) ? "model.embed_tokens" : "lm_head";
  KILN_ASSIGN_OR_RETURN(w.lm_head, linear(f, src, head, c.hidden_size, vocab));
  if (load_mtp_layers) {
    for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
      int64_t layer = c.num_hidden_layers + i;
      const std::string p = "model.layers." + std::to_string(layer);
      if (!src.has(p + ".eh_proj.weight")) break;  // configs announce MTP layers that HF exports drop
      KILN_ASSIGN_OR_RETURN(MtpWeights m, load_mtp(c, s, f, layer, src.has(p + ".shared_head.head.weight")));
      w.mtp.push_back(std::move(m));
    }
  }
  return w;
}

}  // namespace kiln
