#include "model/arch/glm5_next/cuda/glm5_next_cuda_weights.h"

#include <string>

#include "model/arch/glm5_next/glm5_next_sharded_source.h"
#include "model/arch/glm5_next/glm5_next_tensor_names.h"
#include "model/arch/glm5_next/glm5_next_weights.h"
#include "model/model_weights.h"
#include "runtime/cuda/model_glue_kernels.h"
#include "runtime/cuda/weight_upload.h"

namespace kiln::glm5_next::cuda {
namespace {

using kiln::cuda::DummyInit;
using kiln::cuda::GpuLayer;

struct Loader {
  const Glm5NextConfig& c;
  const WeightSource& src;    // Glm5NextTensorNames over the checkpoint (a rank's: its Glm5NextShardedSource)
  const WeightSource& whole;  // the unsplit names (what the shared expert's rank and per-head vectors read)
  WeightFormat& format;
  kiln::cuda::CudaDeviceContext& dev;
  kiln::cuda::WeightUploader up;
  TensorShard shard;
  size_t bytes = 0;

  Loader(const Glm5NextConfig& config, const WeightSource& source, const WeightSource& names, WeightFormat& f,
         kiln::cuda::CudaDeviceContext& d, TensorShard s)
      : c(config), src(source), whole(names), format(f), dev(d), up(source, d.cuda_stream()), shard(s) {}

  Result<std::unique_ptr<Linear>> linear(std::vector<std::string> names, std::vector<int64_t> outs, int64_t in,
                                         const WeightSource* from = nullptr) {
    LinearSpec spec;
    spec.names = std::move(names);
    spec.out_features = std::move(outs);
    spec.in_features = in;
    KILN_ASSIGN_OR_RETURN(auto l, format.load_linear(from ? *from : src, spec));
    if (l->in_features() != in || l->out_features() != spec.total_out())
      return invalid_argument("`" + spec.names[0] + "` loaded as [" + std::to_string(l->out_features()) + ", " +
                              std::to_string(l->in_features()) + "], the config implies [" +
                              std::to_string(spec.total_out()) + ", " + std::to_string(in) + "] (" + c.source + ")");
    if (!l->device().is_cuda())
      return failed_precondition("`" + spec.names[0] + "`: the weight format made it on " + l->device().to_string());
    bytes += l->bytes();
    return l;
  }
  Result<std::unique_ptr<Linear>> linear(const std::string& name, int64_t in, int64_t out) {
    return linear(std::vector<std::string>{name}, std::vector<int64_t>{out}, in);
  }
  // Values [first, first + count) of an fp32 vector of `total` (a rank's heads of a per-head tensor), uploaded; a
  // synthetic source fills `count` values as `init`.
  Result<const float*> f32_part(const std::string& name, int64_t total, int64_t first, int64_t count, DummyInit init) {
    if (src.synthetic() || count == total) return f32(name, 1, count, init);
    KILN_ASSIGN_OR_RETURN(std::vector<float> all, load_f32(whole, name, {total}));
    return upload(name, std::vector<float>(all.begin() + first, all.begin() + first + count));
  }
  Result<const float*> upload(const std::string& name, const std::vector<float>& host) {
    KILN_ASSIGN_OR_RETURN(void* p, dev.allocate(host.size() * 4, name.c_str()));
    KILN_RETURN_IF_ERROR(dev.copy(p, host.data(), host.size() * 4, true));
    bytes += host.size() * 4;
    return static_cast<const float*>(p);
  }
  Result<const float*> f32(const std::string& name, int64_t rows, int64_t cols, DummyInit init) {
    KILN_ASSIGN_OR_RETURN(void* p, dev.allocate(static_cast<size_t>(rows * cols) * 4, name.c_str()));
    KILN_RETURN_IF_ERROR(up.f32(name, rows, cols, static_cast<float*>(p), init));
    bytes += static_cast<size_t>(rows * cols) * 4;
    return static_cast<const float*>(p);
  }
  Result<const uint16_t*> norm(const std::string& name, int64_t dim) {
    KILN_ASSIGN_OR_RETURN(void* p, dev.allocate(static_cast<size_t>(dim) * 2, name.c_str()));
    KILN_RETURN_IF_ERROR(up.bf16(name, 1, dim, static_cast<uint16_t*>(p), DummyInit::kOne));
    bytes += static_cast<size_t>(dim) * 2;
    return static_cast<const uint16_t*>(p);
  }
  Result<const uint16_t*> dense(const Linear& l, const std::string& name) {
    const TensorView d = l.dense_weight();
    if (d.data && d.dtype == DType::kBF16 && d.device.is_cuda()) return d.as<const uint16_t>();
    const size_t n = static_cast<size_t>(l.out_features() * l.in_features());
    KILN_ASSIGN_OR_RETURN(void* p, dev.allocate(n * 2, (name + " (dequantized)").c_str()));
    KILN_RETURN_IF_ERROR(
        l.dequantize(TensorView::contiguous(p, DType::kBF16, {l.out_features(), l.in_features()}, dev.device()),
                     dev.stream())
            .with_context(name));
    bytes += n * 2;
    return static_cast<const uint16_t*>(p);
  }

  Result<MhcGpu> mhc(const std::string& p) {
    const int64_t s = c.hc_mult, mix = (2 + s) * s;
    MhcGpu m;
    KILN_ASSIGN_OR_RETURN(m.fn, f32(p + ".fn", mix, s * c.hidden_size, DummyInit::kRandom));
    KILN_ASSIGN_OR_RETURN(m.base, f32(p + ".base", 1, mix, DummyInit::kZero));
    KILN_ASSIGN_OR_RETURN(m.scale, f32(p + ".scale", 1, 3, DummyInit::kOne));
    return m;
  }

  // Tensor parallelism: this rank's heads [h0, h0 + hl), their channels [h0·d, (h0 + hl)·d) of each of q, k, v (the
  // sharded source serves those rows of the column-parallel projections; the per-head vectors are cut here);
  // f_a / g_a, o_norm and o_proj whole (o_proj reads every head's output, gathered).
  Result<std::unique_ptr<KdaGpu>> kda(const std::string& p) {
    const int64_t hidden = c.hidden_size, h = c.linear_num_heads, d = c.linear_head_dim, ch = c.kda_channels();
    const int64_t h0 = shard.begin(h), hl = shard.count(h), c0 = h0 * d, cl = hl * d;
    const int64_t width = c.linear_conv_kernel_dim;
    auto k = std::make_unique<KdaGpu>();
    KILN_ASSIGN_OR_RETURN(k->qkv, linear({p + ".q_proj", p + ".k_proj", p + ".v_proj"}, {cl, cl, cl}, hidden));
    const size_t conv_n = static_cast<size_t>(3 * cl * width);
    if (src.synthetic()) {
      KILN_ASSIGN_OR_RETURN(void* conv, dev.allocate(conv_n * 4, (p + ".conv1d.weight").c_str()));
      KILN_RETURN_IF_ERROR(kiln::cuda::fill_uniform_f32(static_cast<float*>(conv), conv_n, 0.5f, conv_n, dev.cuda_stream()));
      k->conv = static_cast<const float*>(conv);
      bytes += conv_n * 4;
    } else {
      KILN_ASSIGN_OR_RETURN(std::vector<float> all, load_glm5_next_short_conv(c, whole, p));
      std::vector<float> mine;
      for (int64_t part = 0; part < 3; ++part)  // q, k, v: each its heads' rows of [ch, width]
        mine.insert(mine.end(), all.begin() + (part * ch + c0) * width, all.begin() + (part * ch + c0 + cl) * width);
      KILN_ASSIGN_OR_RETURN(k->conv, upload(p + ".conv1d.weight", mine));
    }
    KILN_ASSIGN_OR_RETURN(k->f_a, linear(p + ".forget_gate.f_a_proj", hidden, d));
    KILN_ASSIGN_OR_RETURN(k->f_b, linear(p + ".forget_gate.f_b_proj", d, cl));
    KILN_ASSIGN_OR_RETURN(k->dt_bias, f32_part(p + ".forget_gate.dt_bias", ch, c0, cl, DummyInit::kZero));
    KILN_ASSIGN_OR_RETURN(k->a_log, f32_part(p + ".forget_gate.A_log", h, h0, hl, DummyInit::kZero));
    KILN_ASSIGN_OR_RETURN(k->b_proj, linear(p + ".b_proj", hidden, hl));
    KILN_ASSIGN_OR_RETURN(k->g_a, linear(p + ".g_a_proj", hidden, d));
    KILN_ASSIGN_OR_RETURN(k->g_b, linear(p + ".g_b_proj", d, cl));
    KILN_ASSIGN_OR_RETURN(k->o_norm, f32(p + ".o_norm.weight", 1, d, DummyInit::kOne));
    KILN_ASSIGN_OR_RETURN(k->o_proj, linear(p + ".o_proj", ch, hidden));
    return k;
  }

  Result<std::unique_ptr<PooledIndexerGpu>> indexer(const std::string& p) {
    const int64_t dim = c.index_head_dim;
    auto x = std::make_unique<PooledIndexerGpu>();
    KILN_ASSIGN_OR_RETURN(x->wq_b, linear(p + ".wq_b", c.q_lora_rank, c.index_n_heads * dim));
    KILN_ASSIGN_OR_RETURN(x->wk, linear(p + ".wk", c.hidden_size, dim));
    KILN_ASSIGN_OR_RETURN(x->weights_proj, linear(p + ".weights_proj", c.hidden_size, c.index_n_heads));
    KILN_ASSIGN_OR_RETURN(x->k_norm_weight, f32(p + ".k_norm.weight", 1, dim, DummyInit::kOne));
    KILN_ASSIGN_OR_RETURN(x->k_norm_bias, f32(p + ".k_norm.bias", 1, dim, DummyInit::kZero));
    KILN_ASSIGN_OR_RETURN(x->ape, f32(p + ".index_kpool_compress_ape", c.index_kpool, dim, DummyInit::kRandom));
    KILN_ASSIGN_OR_RETURN(x->compress_gate,
                          f32(p + ".index_kpool_compress_gate", dim, c.hidden_size, DummyInit::kRandom));
    return x;
  }

  // The DSA attention into the GpuLayer the MLA block reads: q_a and kv_a stacked (one launch), W_UK transposed.
  // Tensor parallelism: q_b / kv_b (and W_UK) of this rank's heads; o_proj whole (its input is gathered).
  Status dsa(const std::string& a, GpuLayer& w) {
    const int64_t H = shard.count(c.num_attention_heads), hd = c.hidden_size, L = c.kv_lora_rank;
    const int64_t nope = c.qk_nope_head_dim, vd = c.v_head_dim;
    KILN_ASSIGN_OR_RETURN(w.qkv_a, linear({a + ".q_a_proj", a + ".kv_a_proj_with_mqa"}, {c.q_lora_rank, L}, hd));
    KILN_ASSIGN_OR_RETURN(w.q_a_norm, norm(a + ".q_a_layernorm.weight", c.q_lora_rank));
    KILN_ASSIGN_OR_RETURN(w.q_b, linear(a + ".q_b_proj", c.q_lora_rank, H * nope));
    KILN_ASSIGN_OR_RETURN(w.kv_a_norm, norm(a + ".kv_a_layernorm.weight", L));
    KILN_ASSIGN_OR_RETURN(w.kv_b, linear(a + ".kv_b_proj", L, H * (nope + vd)));
    KILN_ASSIGN_OR_RETURN(w.kv_b_dense, dense(*w.kv_b, a + ".kv_b_proj"));
    const size_t uk = static_cast<size_t>(H * L * nope) * 2;
    KILN_ASSIGN_OR_RETURN(void* uk_t, dev.allocate(uk, (a + ".kv_b_proj W_UK transposed").c_str()));
    KILN_RETURN_IF_ERROR(kiln::cuda::mla_transpose_w_uk(w.kv_b_dense, H, nope, vd, L, static_cast<uint16_t*>(uk_t),
                                                        dev.cuda_stream()));
    w.w_uk_t = static_cast<const uint16_t*>(uk_t);
    bytes += uk;
    KILN_ASSIGN_OR_RETURN(w.o_proj, linear(a + ".o_proj", c.num_attention_heads * vd, hd));
    return ok_status();
  }

  // Tensor parallelism: a dense MLP's gate / up columns of this rank (down whole, its input gathered); this rank's
  // routed experts (numbered from 0 by the sharded source); the shared expert whole on shared_expert_rank alone, read
  // from the unsplit names, as the MLA + MoE runner holds it (runtime/cuda/gpu_weights.h).
  Status mlp(const std::string& p, bool moe, GpuLayer& w) {
    const int64_t hd = c.hidden_size;
    auto swiglu = [&](const std::string& m, int64_t inter, int64_t cols, const WeightSource* from) -> Status {
      KILN_ASSIGN_OR_RETURN(w.gate_up, linear({m + ".gate_proj", m + ".up_proj"}, {cols, cols}, hd, from));
      KILN_ASSIGN_OR_RETURN(w.down, linear({m + ".down_proj"}, {hd}, inter, from));
      return ok_status();
    };
    w.is_moe = moe;
    if (!w.is_moe) return swiglu(p + ".mlp", c.intermediate_size, shard.count(c.intermediate_size), nullptr);
    const int64_t E = c.n_routed_experts;
    KILN_ASSIGN_OR_RETURN(w.router, f32(p + ".mlp.gate.weight", E, hd, DummyInit::kRandom));
    KILN_ASSIGN_OR_RETURN(w.router_bias, f32(p + ".mlp.gate.e_score_correction_bias", 1, E, DummyInit::kZero));
    ExpertSpec spec;
    spec.prefix = p + ".mlp.experts";
    spec.num_experts = shard.count(E);
    spec.hidden = hd;
    spec.intermediate = c.moe_intermediate_size;
    KILN_ASSIGN_OR_RETURN(w.experts, format.load_experts(src, spec));
    if (!w.experts->device().is_cuda())
      return failed_precondition("`" + spec.prefix + "`: the weight format made them on " + w.experts->device().to_string());
    bytes += w.experts->bytes();
    if (c.n_shared_experts > 0 && shard.rank == shared_expert_rank(shard)) {
      w.has_shared = true;
      const int64_t inter = c.moe_intermediate_size * c.n_shared_experts;
      KILN_RETURN_IF_ERROR(swiglu(p + ".mlp.shared_experts", inter, inter, &whole));
    }
    return ok_status();
  }

  // One decoder layer of the given structure (a trunk layer's from the config, a next-n layer's from its names).
  Result<LayerGpu> layer(const std::string& p, bool is_kda, bool has_indexer, bool moe, bool hyper_connections) {
    LayerGpu w;
    GpuLayer& b = w.block;
    b.latent_norm_eps = static_cast<float>(c.rms_norm_eps);
    b.swiglu_limit = static_cast<float>(c.swiglu_limit);
    w.hyper_connections = hyper_connections;
    KILN_ASSIGN_OR_RETURN(b.input_norm, norm(p + ".input_layernorm.weight", c.hidden_size));
    KILN_ASSIGN_OR_RETURN(b.post_attention_norm, norm(p + ".post_attention_layernorm.weight", c.hidden_size));
    if (hyper_connections) {
      KILN_ASSIGN_OR_RETURN(w.attn_hc, mhc(p + ".attn_hc"));
      KILN_ASSIGN_OR_RETURN(w.ffn_hc, mhc(p + ".ffn_hc"));
    }
    if (is_kda) {
      KILN_ASSIGN_OR_RETURN(w.kda, kda(p + ".self_attn"));
    } else {
      KILN_RETURN_IF_ERROR(dsa(p + ".self_attn", b));
      if (has_indexer) {
        KILN_ASSIGN_OR_RETURN(w.indexer, indexer(p + ".self_attn.indexer"));
      }
    }
    KILN_RETURN_IF_ERROR(mlp(p, moe, b));
    return w;
  }

  Result<MtpGpu> mtp(const std::string& p, const MtpLayerLayout& layout) {
    const int64_t hidden = c.hidden_size;
    MtpGpu m;
    KILN_ASSIGN_OR_RETURN(m.enorm, norm(p + ".enorm.weight", hidden));
    KILN_ASSIGN_OR_RETURN(m.hnorm, norm(p + ".hnorm.weight", hidden));
    KILN_ASSIGN_OR_RETURN(m.head_norm, norm(p + ".shared_head.norm.weight", hidden));
    KILN_ASSIGN_OR_RETURN(m.eh_proj, linear(p + ".eh_proj", 2 * hidden, hidden));
    if (layout.own_head) {
      KILN_ASSIGN_OR_RETURN(m.head, linear(p + ".shared_head.head", hidden, shard.count(c.vocab_size)));
    }
    const bool is_kda = layout.attention == AttentionKind::kKda;
    KILN_ASSIGN_OR_RETURN(m.layer, layer(p, is_kda, layout.indexer, layout.moe, layout.hyper_connections));
    m.layer.dense_attention = !is_kda && !layout.indexer;
    return m;
  }
};

}  // namespace

Result<Glm5NextGpuWeights> load_glm5_next_gpu_weights(const Glm5NextConfig& c, const WeightSource& source,
                                                      WeightFormat& format, kiln::cuda::CudaDeviceContext& device,
                                                      bool load_mtp, TensorShard shard) {
  Glm5NextGpuWeights w;
  auto names = std::make_shared<Glm5NextTensorNames>(source);
  w.names = names;
  if (shard.sharded()) w.sharded = std::make_shared<Glm5NextShardedSource>(*names, c, shard);
  // A synthetic source has every name: take transformers' prefix.
  const std::string prefix = source.synthetic() ? "model.language_model." : names->trunk_prefix();
  Loader ld(c, shard.sharded() ? *w.sharded : *names, *names, format, device, shard);
  const int64_t vocab = shard.count(c.vocab_size);  // this rank's vocabulary rows
  KILN_ASSIGN_OR_RETURN(w.embed, ld.linear(prefix + "embed_tokens", c.hidden_size, vocab));
  KILN_ASSIGN_OR_RETURN(w.embed_tokens, ld.dense(*w.embed, prefix + "embed_tokens"));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KILN_ASSIGN_OR_RETURN(LayerGpu layer, ld.layer(prefix + "layers." + std::to_string(l), c.is_kda(l),
                                                   c.runs_indexer(l), c.moe[l], true));
    w.layers.push_back(std::move(layer));
  }
  KILN_ASSIGN_OR_RETURN(w.final_norm, ld.norm(prefix + "norm.weight", c.hidden_size));
  const std::string head =
      c.tie_word_embeddings && !source.synthetic() && !names->has("lm_head.weight") ? prefix + "embed_tokens" : "lm_head";
  KILN_ASSIGN_OR_RETURN(w.lm_head, ld.linear(head, c.hidden_size, vocab));
  if (load_mtp && !source.synthetic())
    for (size_t i = 0; i < c.mtp.size(); ++i) {
      const std::string p = prefix + "layers." + std::to_string(c.num_hidden_layers + static_cast<int64_t>(i));
      KILN_ASSIGN_OR_RETURN(MtpGpu m, ld.mtp(p, c.mtp[i]));
      w.mtp.push_back(std::move(m));
    }
  KILN_RETURN_IF_ERROR(ld.up.finish());
  w.bytes = ld.bytes;
  return w;
}

}  // namespace kiln::glm5_next::cuda
