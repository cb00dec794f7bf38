#include "runtime/cuda/gpu_weights.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/cpu/half_float.h"

#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/model_glue_kernels.h"
#include "runtime/cuda/weight_upload.h"

namespace kiln::cuda {
namespace {

struct Loader {
  const ModelConfig& c;
  const WeightSource& src;
  WeightFormat& format;
  CudaDeviceContext& dev;
  WeightUploader up;
  TensorShard shard;
  const WeightSource& whole;  // the unsplit checkpoint (the shared expert's rank reads it whole)
  size_t bytes = 0;

  Loader(const ModelConfig& config, const WeightSource& source, WeightFormat& f, CudaDeviceContext& d,
         TensorShard s, const WeightSource& w)
      : c(config), src(source), format(f), dev(d), up(source, d.cuda_stream()), shard(s), whole(w) {}

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
                              std::to_string(spec.total_out()) + ", " + std::to_string(in) + "]");
    if (!l->device().is_cuda())
      return failed_precondition("`" + spec.names[0] + "`: the weight format made it on " + l->device().to_string());
    bytes += l->bytes();
    return l;
  }
  Result<std::unique_ptr<Linear>> linear(const std::string& name, int64_t in, int64_t out) {
    // Spelled out: `{name}, {out}` would pick this overload again (identity conversions beat the vectors').
    return linear(std::vector<std::string>{name}, std::vector<int64_t>{out}, in);
  }
  Result<uint16_t*> bf16(const std::string& name, int64_t rows, int64_t cols, DummyInit init) {
    KILN_ASSIGN_OR_RETURN(void* p, dev.allocate(static_cast<size_t>(rows * cols) * 2, name.c_str()));
    auto* w = static_cast<uint16_t*>(p);
    KILN_RETURN_IF_ERROR(up.bf16(name, rows, cols, w, init));
    bytes += static_cast<size_t>(rows * cols) * 2;
    return w;
  }
  Result<float*> f32(const std::string& name, int64_t rows, int64_t cols, DummyInit init) {
    KILN_ASSIGN_OR_RETURN(void* p, dev.allocate(static_cast<size_t>(rows * cols) * 4, name.c_str()));
    auto* w = static_cast<float*>(p);
    KILN_RETURN_IF_ERROR(up.f32(name, rows, cols, w, init));
    bytes += static_cast<size_t>(rows * cols) * 4;
    return w;
  }
  // w.router as exact bf16 terms (GpuLayer::router_bf16_terms, cpu::bf16_terms). A value the three cannot hold, or
  // more terms · E than hidden, leaves the layer without terms: its prefill gate stays an fp32 GEMM.
  Status router_terms(const std::string& name, int64_t E, int64_t hd, GpuLayer& w) {
    const size_t n = static_cast<size_t>(E * hd);
    std::vector<float> host(n);
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(host.data(), w.router, n * 4, cudaMemcpyDeviceToHost, dev.cuda_stream()),
                                 "router terms: read back"));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(dev.cuda_stream()), "router terms: read back"));
    std::vector<uint16_t> terms(3 * n);
    const int used = cpu::bf16_terms(host.data(), static_cast<int64_t>(n), terms.data());
    if (used == 0 || used * E > hd) return ok_status();  // the gate's scratch holds hidden columns a row
    const size_t bytes = static_cast<size_t>(used) * n * 2;
    KILN_ASSIGN_OR_RETURN(void* p, dev.allocate(bytes, (name + " (bf16 terms)").c_str()));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(p, terms.data(), bytes, cudaMemcpyHostToDevice, dev.cuda_stream()),
                                 "router terms: upload"));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(dev.cuda_stream()), "router terms: upload"));
    w.router_bf16_terms = static_cast<const uint16_t*>(p);
    w.router_terms = used;
    this->bytes += bytes;
    return ok_status();
  }
  Result<const uint16_t*> norm(const std::string& name, int64_t dim) {
    KILN_ASSIGN_OR_RETURN(uint16_t * w, bf16(name, 1, dim, DummyInit::kOne));
    return static_cast<const uint16_t*>(w);
  }
  // A Linear's weight as dense bf16 on the device: its own storage when dense, else a copy dequantized once.
  Result<const uint16_t*> dense(const Linear& l, const std::string& name) {
    const TensorView d = l.dense_weight();
    if (d.data && d.dtype == DType::kBF16 && d.device.is_cuda()) return d.as<const uint16_t>();
    const size_t n = static_cast<size_t>(l.out_features() * l.in_features());
    KILN_ASSIGN_OR_RETURN(void* p, dev.allocate(n * 2, (name + " (dequantized)").c_str()));
    KILN_RETURN_IF_ERROR(
        l.dequantize(TensorView::contiguous(p, DType::kBF16, {l.out_features(), l.in_features()}, dev.device()), dev.stream())
            .with_context(name));
    bytes += n * 2;
    return static_cast<const uint16_t*>(p);
  }
  // gate and up stacked (gate rows first, `local` of them each: this rank's columns), from `from`; then down (all
  // `inter` columns).
  Status swiglu_mlp(const std::string& p, int64_t inter, int64_t local, GpuLayer& w, const WeightSource* from = nullptr) {
    const int64_t hd = c.hidden_size;
    KILN_ASSIGN_OR_RETURN(w.gate_up, linear({p + ".gate_proj", p + ".up_proj"}, {local, local}, hd, from));
    KILN_ASSIGN_OR_RETURN(w.down, linear({p + ".down_proj"}, {hd}, inter, from));
    return ok_status();
  }

  Result<GpuLayer> layer(int64_t l) {
    GpuLayer w;
    const std::string p = "model.layers." + std::to_string(l);
    // H: this rank's heads (all of them on one rank); o_proj reads every head's output (gathered).
    const int64_t H = shard.count(c.num_attention_heads), hd = c.hidden_size;
    KILN_ASSIGN_OR_RETURN(w.input_norm, norm(p + ".input_layernorm.weight", hd));
    KILN_ASSIGN_OR_RETURN(w.post_attention_norm, norm(p + ".post_attention_layernorm.weight", hd));
    const std::string a = p + ".self_attn";
    const int64_t D = c.kv_lora_rank + c.qk_rope_head_dim;
    if (c.q_lora_rank > 0) {
      KILN_ASSIGN_OR_RETURN(w.qkv_a, linear({a + ".q_a_proj", a + ".kv_a_proj_with_mqa"}, {c.q_lora_rank, D}, hd));
      KILN_ASSIGN_OR_RETURN(w.q_a_norm, norm(a + ".q_a_layernorm.weight", c.q_lora_rank));
      KILN_ASSIGN_OR_RETURN(w.q_b, linear(a + ".q_b_proj", c.q_lora_rank, H * c.qk_head_dim()));
    } else {
      KILN_ASSIGN_OR_RETURN(w.q_proj, linear(a + ".q_proj", hd, H * c.qk_head_dim()));
      KILN_ASSIGN_OR_RETURN(w.kv_a, linear(a + ".kv_a_proj_with_mqa", hd, D));
    }
    KILN_ASSIGN_OR_RETURN(w.kv_a_norm, norm(a + ".kv_a_layernorm.weight", c.kv_lora_rank));
    KILN_ASSIGN_OR_RETURN(w.kv_b, linear(a + ".kv_b_proj", c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim)));
    KILN_ASSIGN_OR_RETURN(w.kv_b_dense, dense(*w.kv_b, a + ".kv_b_proj"));
    KILN_ASSIGN_OR_RETURN(void* uk_t, dev.allocate(static_cast<size_t>(H * c.kv_lora_rank * c.qk_nope_head_dim) * 2,
                                                   (a + ".kv_b_proj W_UK transposed").c_str()));
    KILN_RETURN_IF_ERROR(mla_transpose_w_uk(w.kv_b_dense, H, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank,
                                            static_cast<uint16_t*>(uk_t), dev.cuda_stream()));
    w.w_uk_t = static_cast<const uint16_t*>(uk_t);
    bytes += static_cast<size_t>(H * c.kv_lora_rank * c.qk_nope_head_dim) * 2;
    KILN_ASSIGN_OR_RETURN(w.o_proj, linear(a + ".o_proj", c.num_attention_heads * c.v_head_dim, hd));
    if (c.has_indexer() && !c.indexer_is_shared(l)) {
      const std::string ip = a + ".indexer";
      const int64_t Di = c.index_head_dim;
      auto idx = std::make_unique<GpuIndexer>();
      KILN_ASSIGN_OR_RETURN(idx->wq_b, linear(ip + ".wq_b", c.q_lora_rank, c.index_n_heads * Di));
      KILN_ASSIGN_OR_RETURN(idx->wk, linear(ip + ".wk", hd, Di));
      KILN_ASSIGN_OR_RETURN(idx->weights_proj, linear(ip + ".weights_proj", hd, c.index_n_heads));
      KILN_ASSIGN_OR_RETURN(idx->k_norm_weight, f32(ip + ".k_norm.weight", 1, Di, DummyInit::kOne));
      KILN_ASSIGN_OR_RETURN(idx->k_norm_bias, f32(ip + ".k_norm.bias", 1, Di, DummyInit::kZero));
      w.indexer = std::move(idx);
    }
    w.is_moe = c.is_moe(l);
    if (!w.is_moe) {
      KILN_RETURN_IF_ERROR(swiglu_mlp(p + ".mlp", c.intermediate_size, shard.count(c.intermediate_size), w));
      return w;
    }
    const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
    KILN_ASSIGN_OR_RETURN(w.router, f32(p + ".mlp.gate.weight", E, hd, DummyInit::kRandom));
    KILN_ASSIGN_OR_RETURN(w.router_bias, f32(p + ".mlp.gate.e_score_correction_bias", 1, E, DummyInit::kZero));
    KILN_RETURN_IF_ERROR(router_terms(p + ".mlp.gate.weight", E, hd, w));
    ExpertSpec spec;
    spec.prefix = p + ".mlp.experts";
    spec.num_experts = shard.count(E);  // this rank's, numbered from 0 by the sharded source
    spec.hidden = hd;
    spec.intermediate = I;
    KILN_ASSIGN_OR_RETURN(w.experts, format.load_experts(src, spec));
    if (!w.experts->device().is_cuda())
      return failed_precondition("`" + spec.prefix + "`: the weight format made them on " + w.experts->device().to_string());
    bytes += w.experts->bytes();
    if (c.n_shared_experts > 0 && shard.rank == shared_expert_rank(shard)) {
      w.has_shared = true;
      const int64_t inter = I * c.n_shared_experts;
      KILN_RETURN_IF_ERROR(swiglu_mlp(p + ".mlp.shared_experts", inter, inter, w, &whole));
    }
    return w;
  }
};

}  // namespace

Result<GpuWeights> load_gpu_weights(const ModelConfig& c, const WeightSource& source, WeightFormat& format,
                                    CudaDeviceContext& device, bool load_mtp, TensorShard shard,
                                    const WeightSource* whole) {
  if (shard.sharded() && !whole) return invalid_argument("a tensor-parallel rank's weights need the unsplit checkpoint too");
  Loader ld(c, source, format, device, shard, whole ? *whole : source);
  GpuWeights w;
  const int64_t vocab = shard.count(c.vocab_size);  // this rank's vocabulary rows
  KILN_ASSIGN_OR_RETURN(w.embed, ld.linear("model.embed_tokens", c.hidden_size, vocab));
  KILN_ASSIGN_OR_RETURN(w.embed_tokens, ld.dense(*w.embed, "model.embed_tokens"));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KILN_ASSIGN_OR_RETURN(GpuLayer layer, ld.layer(l));
    w.layers.push_back(std::move(layer));
  }
  KILN_ASSIGN_OR_RETURN(w.final_norm, ld.norm("model.norm.weight", c.hidden_size));
  if (c.tie_word_embeddings && (source.synthetic() || !source.has("lm_head.weight"))) {
    w.lm_head = w.embed;
  } else {
    KILN_ASSIGN_OR_RETURN(w.lm_head, ld.linear("lm_head", c.hidden_size, vocab));
  }
  for (int64_t i = 0; load_mtp && i < c.num_nextn_predict_layers; ++i) {
    const int64_t l = c.num_hidden_layers + i;
    const std::string p = "model.layers." + std::to_string(l);
    if (!source.synthetic() && !source.has(p + ".eh_proj.weight")) break;  // as the CPU loader: exports may drop them
    GpuMtpLayer m;
    KILN_ASSIGN_OR_RETURN(m.enorm, ld.norm(p + ".enorm.weight", c.hidden_size));
    KILN_ASSIGN_OR_RETURN(m.hnorm, ld.norm(p + ".hnorm.weight", c.hidden_size));
    KILN_ASSIGN_OR_RETURN(m.head_norm, ld.norm(p + ".shared_head.norm.weight", c.hidden_size));
    KILN_ASSIGN_OR_RETURN(m.eh_proj, ld.linear(p + ".eh_proj", 2 * c.hidden_size, c.hidden_size));
    if (!source.synthetic() && source.has(p + ".shared_head.head.weight")) {
      KILN_ASSIGN_OR_RETURN(m.head, ld.linear(p + ".shared_head.head", c.hidden_size, vocab));
    } else {
      m.head = w.lm_head;
    }
    KILN_ASSIGN_OR_RETURN(m.layer, ld.layer(l));
    w.mtp.push_back(std::move(m));
  }
  w.bytes = ld.bytes;
  KILN_RETURN_IF_ERROR(ld.up.finish());
  return w;
}

}  // namespace kiln::cuda
