#include "runtime/cuda/gpu_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/half_float.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {

constexpr float kDummyStd = 0.02f;

enum class Init { kRandom, kOne, kZero };

// Fills device tensors by name: from the checkpoint (converted to bf16 / fp32 on the host) or with dummy values.
class Filler {
 public:
  Filler(const WeightSource* src, uint64_t seed, StreamHandle stream) : src_(src), seed_(seed), stream_(stream) {}

  Status bf16(const std::string& name, int64_t rows, int64_t cols, uint16_t* dst, Init init = Init::kRandom) {
    const size_t n = static_cast<size_t>(rows * cols);
    if (!src_) {
      ++counter_;
      if (init == Init::kRandom)
        return fill_uniform_bf16(dst, n, kDummyStd * std::sqrt(3.0f), seed_ + counter_ * 0x9E3779B97F4A7C15ull, stream_);
      return fill_constant_bf16(dst, n, init == Init::kOne ? 1.0f : 0.0f, stream_);
    }
    KILN_ASSIGN_OR_RETURN(TensorView t, checked(name, rows, cols));
    host_.resize(n);
    switch (t.dtype) {
      case DType::kBF16: std::copy_n(t.as<const uint16_t>(), n, host_.begin()); break;
      case DType::kF32: cpu::float_to_bf16(t.as<const float>(), host_.data(), static_cast<int64_t>(n)); break;
      case DType::kF16: {
        std::vector<float> f(n);
        cpu::fp16_to_float(t.as<const uint16_t>(), f.data(), static_cast<int64_t>(n));
        cpu::float_to_bf16(f.data(), host_.data(), static_cast<int64_t>(n));
        break;
      }
      default: return invalid_argument("tensor `" + name + "` has dtype " + dtype_name(t.dtype) + "; expected F32, BF16 or F16");
    }
    return copy(dst, host_.data(), n * sizeof(uint16_t), name);
  }

  Status f32(const std::string& name, int64_t rows, int64_t cols, float* dst, Init init) {
    const size_t n = static_cast<size_t>(rows * cols);
    if (!src_) {
      ++counter_;
      if (init == Init::kRandom)
        return fill_uniform_f32(dst, n, kDummyStd * std::sqrt(3.0f), seed_ + counter_ * 0x9E3779B97F4A7C15ull, stream_);
      return fill_constant_f32(dst, n, init == Init::kOne ? 1.0f : 0.0f, stream_);
    }
    if (init == Init::kZero && !src_->has(name)) return fill_constant_f32(dst, n, 0.0f, stream_);
    KILN_ASSIGN_OR_RETURN(TensorView t, checked(name, rows, cols));
    std::vector<float> f(n);
    switch (t.dtype) {
      case DType::kF32: std::copy_n(t.as<const float>(), n, f.begin()); break;
      case DType::kBF16: cpu::bf16_to_float(t.as<const uint16_t>(), f.data(), static_cast<int64_t>(n)); break;
      case DType::kF16: cpu::fp16_to_float(t.as<const uint16_t>(), f.data(), static_cast<int64_t>(n)); break;
      default: return invalid_argument("tensor `" + name + "` has dtype " + dtype_name(t.dtype) + "; expected F32, BF16 or F16");
    }
    return copy(dst, f.data(), n * sizeof(float), name);
  }

  bool has(const std::string& name) const { return src_ && src_->has(name); }
  bool dummy() const { return src_ == nullptr; }

 private:
  Result<TensorView> checked(const std::string& name, int64_t rows, int64_t cols) {
    KILN_ASSIGN_OR_RETURN(TensorView t, src_->get(name));
    const bool ok = (t.rank == 2 && t.shape[0] == rows && t.shape[1] == cols) || (t.rank == 1 && rows == 1 && t.shape[0] == cols);
    if (!ok)
      return invalid_argument("tensor `" + name + "` has shape " + t.shape_string() + ", the config implies [" +
                              std::to_string(rows) + ", " + std::to_string(cols) + "]");
    return t;
  }
  Status copy(void* dst, const void* src, size_t bytes, const std::string& name) {
    // Synchronous: the host staging buffer is reused for the next tensor.
    const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return internal_error("uploading `" + name + "`: " + cudaGetErrorString(e));
    return ok_status();
  }
  const WeightSource* src_;
  uint64_t seed_;
  StreamHandle stream_;
  uint64_t counter_ = 0;
  std::vector<uint16_t> host_;
};

struct Loader {
  const ModelConfig& c;
  Filler& fill;
  DeviceArena& arena;
  StreamHandle stream;
  size_t bytes = 0;

  Result<uint16_t*> bf16_buffer(size_t n, const std::string& name) {
    bytes += n * 2;
    return arena.allocate_array<uint16_t>(n, name.c_str());
  }
  Result<GpuLinear> linear(const std::string& name, int64_t in, int64_t out) {
    KILN_ASSIGN_OR_RETURN(uint16_t * w, bf16_buffer(static_cast<size_t>(in * out), name));
    KILN_RETURN_IF_ERROR(fill.bf16(name + ".weight", out, in, w));
    return GpuLinear{w, in, out};
  }
  Result<const uint16_t*> norm(const std::string& name, int64_t dim) {
    KILN_ASSIGN_OR_RETURN(uint16_t * w, bf16_buffer(static_cast<size_t>(dim), name));
    KILN_RETURN_IF_ERROR(fill.bf16(name, 1, dim, w, Init::kOne));
    return w;
  }
  // gate and up into one [2·inter, hidden] buffer (gate rows first); then down.
  Status swiglu_mlp(const std::string& p, int64_t inter, GpuLinear& gate_up, GpuLinear& down) {
    const int64_t hd = c.hidden_size;
    KILN_ASSIGN_OR_RETURN(uint16_t * gu, bf16_buffer(static_cast<size_t>(2 * inter * hd), p));
    KILN_RETURN_IF_ERROR(fill.bf16(p + ".gate_proj.weight", inter, hd, gu));
    KILN_RETURN_IF_ERROR(fill.bf16(p + ".up_proj.weight", inter, hd, gu + inter * hd));
    gate_up = GpuLinear{gu, hd, 2 * inter};
    KILN_ASSIGN_OR_RETURN(down, linear(p + ".down_proj", inter, hd));
    return ok_status();
  }

  Result<GpuLayer> layer(int64_t l) {
    GpuLayer w;
    const std::string p = "model.layers." + std::to_string(l);
    const int64_t H = c.num_attention_heads, hd = c.hidden_size;
    KILN_ASSIGN_OR_RETURN(w.input_norm, norm(p + ".input_layernorm.weight", hd));
    KILN_ASSIGN_OR_RETURN(w.post_attention_norm, norm(p + ".post_attention_layernorm.weight", hd));
    const std::string a = p + ".self_attn";
    const int64_t D = c.kv_lora_rank + c.qk_rope_head_dim;
    if (c.q_lora_rank > 0) {
      const int64_t q_lora = c.q_lora_rank;
      KILN_ASSIGN_OR_RETURN(uint16_t * qkv, bf16_buffer(static_cast<size_t>((q_lora + D) * hd), a + ".q_a_proj + kv_a"));
      KILN_RETURN_IF_ERROR(fill.bf16(a + ".q_a_proj.weight", q_lora, hd, qkv));
      KILN_RETURN_IF_ERROR(fill.bf16(a + ".kv_a_proj_with_mqa.weight", D, hd, qkv + q_lora * hd));
      w.qkv_a = GpuLinear{qkv, hd, q_lora + D};
      w.q_a = GpuLinear{qkv, hd, q_lora};
      w.kv_a = GpuLinear{qkv + q_lora * hd, hd, D};
      KILN_ASSIGN_OR_RETURN(w.q_a_norm, norm(a + ".q_a_layernorm.weight", q_lora));
      KILN_ASSIGN_OR_RETURN(w.q_b, linear(a + ".q_b_proj", q_lora, H * c.qk_head_dim()));
    } else {
      KILN_ASSIGN_OR_RETURN(w.q_proj, linear(a + ".q_proj", hd, H * c.qk_head_dim()));
      KILN_ASSIGN_OR_RETURN(w.kv_a, linear(a + ".kv_a_proj_with_mqa", hd, D));
    }
    KILN_ASSIGN_OR_RETURN(w.kv_a_norm, norm(a + ".kv_a_layernorm.weight", c.kv_lora_rank));
    KILN_ASSIGN_OR_RETURN(w.kv_b, linear(a + ".kv_b_proj", c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim)));
    KILN_ASSIGN_OR_RETURN(uint16_t * uk_t, bf16_buffer(static_cast<size_t>(H * c.kv_lora_rank * c.qk_nope_head_dim),
                                                       a + ".kv_b_proj W_UK transposed"));
    // A checkpoint's kv_b arrives by cudaMemcpy from pageable memory, which may return before the DMA lands.
    const cudaError_t landed = cudaDeviceSynchronize();
    if (landed != cudaSuccess) return internal_error(a + ".kv_b_proj upload: " + cudaGetErrorString(landed));
    KILN_RETURN_IF_ERROR(
        mla_transpose_w_uk(w.kv_b.w, H, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank, uk_t, stream));
    w.w_uk_t = uk_t;
    KILN_ASSIGN_OR_RETURN(w.o_proj, linear(a + ".o_proj", H * c.v_head_dim, hd));
    if (c.has_indexer() && !c.indexer_is_shared(l)) {
      const std::string ip = a + ".indexer";
      const int64_t D = c.index_head_dim;
      w.has_indexer = true;
      KILN_ASSIGN_OR_RETURN(w.indexer.wq_b, linear(ip + ".wq_b", c.q_lora_rank, c.index_n_heads * D));
      KILN_ASSIGN_OR_RETURN(w.indexer.wk, linear(ip + ".wk", hd, D));
      KILN_ASSIGN_OR_RETURN(w.indexer.weights_proj, linear(ip + ".weights_proj", hd, c.index_n_heads));
      KILN_ASSIGN_OR_RETURN(float* kn, arena.allocate_array<float>(static_cast<size_t>(2 * D), "indexer k_norm"));
      KILN_RETURN_IF_ERROR(fill.f32(ip + ".k_norm.weight", 1, D, kn, Init::kOne));
      KILN_RETURN_IF_ERROR(fill.f32(ip + ".k_norm.bias", 1, D, kn + D, Init::kZero));
      bytes += static_cast<size_t>(2 * D) * 4;
      w.indexer.k_norm_weight = kn;
      w.indexer.k_norm_bias = kn + D;
    }
    w.is_moe = c.is_moe(l);
    if (!w.is_moe) {
      KILN_RETURN_IF_ERROR(swiglu_mlp(p + ".mlp", c.intermediate_size, w.gate_up, w.down));
      return w;
    }
    const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
    KILN_ASSIGN_OR_RETURN(float* router, arena.allocate_array<float>(static_cast<size_t>(E * hd), "router"));
    KILN_RETURN_IF_ERROR(fill.f32(p + ".mlp.gate.weight", E, hd, router, Init::kRandom));
    KILN_ASSIGN_OR_RETURN(float* bias, arena.allocate_array<float>(static_cast<size_t>(E), "router bias"));
    KILN_RETURN_IF_ERROR(fill.f32(p + ".mlp.gate.e_score_correction_bias", 1, E, bias, Init::kZero));
    bytes += static_cast<size_t>(E * hd + E) * 4;
    w.router = router;
    w.router_bias = bias;
    KILN_ASSIGN_OR_RETURN(uint16_t * gu, bf16_buffer(static_cast<size_t>(E * 2 * I * hd), p + ".mlp.experts"));
    KILN_ASSIGN_OR_RETURN(uint16_t * dn, bf16_buffer(static_cast<size_t>(E * hd * I), p + ".mlp.experts"));
    for (int64_t e = 0; e < E; ++e) {
      const std::string b = p + ".mlp.experts." + std::to_string(e);
      KILN_RETURN_IF_ERROR(fill.bf16(b + ".gate_proj.weight", I, hd, gu + e * 2 * I * hd));
      KILN_RETURN_IF_ERROR(fill.bf16(b + ".up_proj.weight", I, hd, gu + e * 2 * I * hd + I * hd));
      KILN_RETURN_IF_ERROR(fill.bf16(b + ".down_proj.weight", hd, I, dn + e * hd * I));
    }
    w.experts_gate_up = gu;
    w.experts_down = dn;
    if (c.n_shared_experts > 0) {
      w.has_shared = true;
      KILN_RETURN_IF_ERROR(swiglu_mlp(p + ".mlp.shared_experts", I * c.n_shared_experts, w.gate_up, w.down));
    }
    return w;
  }
};

}  // namespace

Result<GpuWeights> load_gpu_weights(const ModelConfig& c, const WeightSource* source, DeviceArena& arena, uint64_t seed,
                                    StreamHandle stream, bool load_mtp) {
  Filler fill(source, seed, stream);
  Loader ld{c, fill, arena, stream};
  GpuWeights w;
  KILN_ASSIGN_OR_RETURN(uint16_t * embed, ld.bf16_buffer(static_cast<size_t>(c.vocab_size * c.hidden_size), "embed_tokens"));
  KILN_RETURN_IF_ERROR(fill.bf16("model.embed_tokens.weight", c.vocab_size, c.hidden_size, embed));
  w.embed_tokens = embed;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KILN_ASSIGN_OR_RETURN(GpuLayer layer, ld.layer(l));
    w.layers.push_back(layer);
  }
  KILN_ASSIGN_OR_RETURN(w.final_norm, ld.norm("model.norm.weight", c.hidden_size));
  if (c.tie_word_embeddings && !fill.has("lm_head.weight")) {
    w.lm_head = GpuLinear{embed, c.hidden_size, c.vocab_size};
  } else {
    KILN_ASSIGN_OR_RETURN(w.lm_head, ld.linear("lm_head", c.hidden_size, c.vocab_size));
  }
  for (int64_t i = 0; load_mtp && i < c.num_nextn_predict_layers; ++i) {
    const int64_t l = c.num_hidden_layers + i;
    const std::string p = "model.layers." + std::to_string(l);
    if (!fill.dummy() && !fill.has(p + ".eh_proj.weight")) break;  // as the CPU loader: exports may drop them
    GpuMtpLayer m;
    KILN_ASSIGN_OR_RETURN(m.enorm, ld.norm(p + ".enorm.weight", c.hidden_size));
    KILN_ASSIGN_OR_RETURN(m.hnorm, ld.norm(p + ".hnorm.weight", c.hidden_size));
    KILN_ASSIGN_OR_RETURN(m.head_norm, ld.norm(p + ".shared_head.norm.weight", c.hidden_size));
    KILN_ASSIGN_OR_RETURN(m.eh_proj, ld.linear(p + ".eh_proj", 2 * c.hidden_size, c.hidden_size));
    if (fill.has(p + ".shared_head.head.weight")) {
      KILN_ASSIGN_OR_RETURN(m.head, ld.linear(p + ".shared_head.head", c.hidden_size, c.vocab_size));
    } else {
      m.head = w.lm_head;
    }
    KILN_ASSIGN_OR_RETURN(m.layer, ld.layer(l));
    w.mtp.push_back(m);
  }
  w.bytes = ld.bytes;
  const cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return internal_error(std::string("weight upload: ") + cudaGetErrorString(e));
  return w;
}

}  // namespace kiln::cuda
