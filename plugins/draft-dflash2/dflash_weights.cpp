#include "dflash_weights.h"

#include <cstring>

namespace kiln::dflash {
namespace {

float bf16_to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = man;
      do { ++e; m <<= 1; } while ((m & 0x400) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

class Reader {
 public:
  Reader(const WeightSource& s, std::string where) : s_(s), where_(std::move(where)) {}

  // The tensor `name` (bare or under `model.`), which must have exactly `shape`.
  Result<std::vector<float>> get(const std::string& name, std::vector<int64_t> shape) {
    std::string found = name;
    if (!s_.has(found)) found = "model." + name;
    if (!s_.has(found))
      return not_found(where_ + ": the drafter checkpoint has no tensor `" + name + "` (nor `model." + name +
                       "`), which its config.json implies");
    KILN_ASSIGN_OR_RETURN(TensorView t, s_.get(found));
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    want += "]";
    bool same = t.rank == static_cast<int>(shape.size());
    for (size_t i = 0; same && i < shape.size(); ++i) same = t.shape[i] == shape[i];
    if (!same)
      return invalid_argument(where_ + ": tensor `" + found + "` has shape " + t.shape_string() + ", config.json implies " +
                              want);
    if (!t.is_contiguous()) return invalid_argument(where_ + ": tensor `" + found + "` is not contiguous");
    std::vector<float> out(static_cast<size_t>(t.numel()));
    switch (t.dtype) {
      case DType::kF32: std::memcpy(out.data(), t.data, out.size() * 4); break;
      case DType::kBF16:
        for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(t.as<const uint16_t>()[i]);
        break;
      case DType::kF16:
        for (size_t i = 0; i < out.size(); ++i) out[i] = f16_to_float(t.as<const uint16_t>()[i]);
        break;
      default:
        return invalid_argument(where_ + ": tensor `" + found + "` is " + dtype_name(t.dtype) +
                                "; the drafter reads bf16, fp16 or fp32");
    }
    return out;
  }

  Result<Matrix> matrix(const std::string& name, int64_t rows, int64_t cols) {
    Matrix m;
    KILN_ASSIGN_OR_RETURN(m.w, get(name, {rows, cols}));
    m.rows = rows, m.cols = cols;
    return m;
  }

  Result<DynamicConvWeights> conv(const std::string& prefix, const DflashConfig& c) {
    DynamicConvWeights d;
    KILN_ASSIGN_OR_RETURN(d.base.w, get(prefix + ".base_kernel", {2, c.conv_taps, c.hidden}));
    d.base.rows = 2 * c.conv_taps, d.base.cols = c.hidden;
    KILN_ASSIGN_OR_RETURN(d.projection,
                          matrix(prefix + ".kernel_projection.weight", 2 * c.conv_taps * (c.hidden / c.conv_group), c.hidden));
    return d;
  }

 private:
  const WeightSource& s_;
  std::string where_;
};

}  // namespace

Result<DflashWeights> load_weights(const WeightSource& source, const DflashConfig& c, int64_t target_hidden,
                                   const std::string& where) {
  Reader r(source, where);
  DflashWeights w;
  const int64_t H = c.hidden, hd = c.head_dim;
  KILN_ASSIGN_OR_RETURN(w.fc, r.matrix("fc.weight", H, static_cast<int64_t>(c.target_layers.size()) * target_hidden));
  KILN_ASSIGN_OR_RETURN(w.hidden_norm, r.get("hidden_norm.weight", {H}));
  KILN_ASSIGN_OR_RETURN(w.norm, r.get("norm.weight", {H}));
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerWeights l;
    KILN_ASSIGN_OR_RETURN(l.input_norm, r.get(p + "input_layernorm.weight", {H}));
    KILN_ASSIGN_OR_RETURN(l.post_norm, r.get(p + "post_attention_layernorm.weight", {H}));
    KILN_ASSIGN_OR_RETURN(l.q, r.matrix(p + "self_attn.q_proj.weight", c.heads * hd, H));
    KILN_ASSIGN_OR_RETURN(l.k, r.matrix(p + "self_attn.k_proj.weight", c.kv_heads * hd, H));
    KILN_ASSIGN_OR_RETURN(l.v, r.matrix(p + "self_attn.v_proj.weight", c.kv_heads * hd, H));
    KILN_ASSIGN_OR_RETURN(l.o, r.matrix(p + "self_attn.o_proj.weight", H, c.heads * hd));
    KILN_ASSIGN_OR_RETURN(l.q_norm, r.get(p + "self_attn.q_norm.weight", {hd}));
    KILN_ASSIGN_OR_RETURN(l.k_norm, r.get(p + "self_attn.k_norm.weight", {hd}));
    KILN_ASSIGN_OR_RETURN(l.gate, r.matrix(p + "mlp.gate_proj.weight", c.intermediate, H));
    KILN_ASSIGN_OR_RETURN(l.up, r.matrix(p + "mlp.up_proj.weight", c.intermediate, H));
    KILN_ASSIGN_OR_RETURN(l.down, r.matrix(p + "mlp.down_proj.weight", H, c.intermediate));
    if (c.v2) {
      KILN_ASSIGN_OR_RETURN(l.attention_conv, r.conv(p + "attention_conv", c));
      KILN_ASSIGN_OR_RETURN(l.mlp_conv, r.conv(p + "mlp_conv", c));
    }
    w.layers.push_back(std::move(l));
  }
  if (c.v2) {
    KILN_ASSIGN_OR_RETURN(w.selector_projection, r.matrix("candidate_selector.hidden_projection.weight", c.selector_rank, H));
    KILN_ASSIGN_OR_RETURN(w.predecessor, r.matrix("candidate_selector.predecessor_codebook", c.vocab, c.selector_rank));
    KILN_ASSIGN_OR_RETURN(w.successor, r.matrix("candidate_selector.successor_codebook", c.vocab, c.selector_rank));
  }
  return w;
}

}  // namespace kiln::dflash
