#include "builtin/dense_weight_format.h"

#include <string>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half_float.h"

namespace kiln::builtin {
namespace {

bool is_dense_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Fetches `name` and checks it is a contiguous host matrix of a dense dtype with the expected shape
// (a dimension of −1 accepts any size).
Result<TensorView> get_matrix(const WeightSource& source, const std::string& name, int64_t rows, int64_t cols) {
  if (!source.has(name)) return not_found("tensor `" + name + "` is not in the checkpoint");
  KILN_ASSIGN_OR_RETURN(TensorView t, source.get(name));
  if (t.rank != 2) return invalid_argument("tensor `" + name + "` has shape " + t.shape_string() + ", expected a 2-D matrix");
  if ((rows >= 0 && t.shape[0] != rows) || (cols >= 0 && t.shape[1] != cols))
    return invalid_argument("tensor `" + name + "` has shape " + t.shape_string() + ", expected [" +
                            (rows >= 0 ? std::to_string(rows) : "*") + ", " + (cols >= 0 ? std::to_string(cols) : "*") + "]");
  if (!is_dense_dtype(t.dtype))
    return invalid_argument("tensor `" + name + "` is " + dtype_name(t.dtype) +
                            "; the `dense` weight format serves F32, BF16 and F16 (quantized checkpoints need their "
                            "weight-format plugin)");
  if (!t.device.is_cpu() || !t.is_contiguous())
    return invalid_argument("tensor `" + name + "` must be a contiguous host tensor (got " + t.device.to_string() + ")");
  return t;
}

Status check_activations(const char* what, const TensorView& t, int64_t width, const std::string& layer) {
  if (!t.device.is_cpu())
    return unimplemented("`" + layer + "`: the built-in `dense` format runs on the CPU only for now; " + what +
                         " is on " + t.device.to_string());
  if (t.dtype != DType::kF32 || !t.is_contiguous() || t.rank < 1 || t.dim(-1) != width)
    return invalid_argument("`" + layer + "`: " + what + " must be contiguous F32 [..., " + std::to_string(width) +
                            "], got " + dtype_name(t.dtype) + " " + t.shape_string());
  return ok_status();
}

Status widen_to_f32(const TensorView& w, float* out) {
  const int64_t n = w.numel();
  switch (w.dtype) {
    case DType::kF32: std::copy(w.as<const float>(), w.as<const float>() + n, out); return ok_status();
    case DType::kBF16: cpu::bf16_to_float(w.as<const uint16_t>(), out, n); return ok_status();
    case DType::kF16: cpu::fp16_to_float(w.as<const uint16_t>(), out, n); return ok_status();
    default: return internal_error("dense weight of unexpected dtype");
  }
}

class DenseLinear final : public Linear {
 public:
  DenseLinear(std::string name, TensorView weight) : name_(std::move(name)), weight_(weight) {}

  int64_t in_features() const override { return weight_.shape[1]; }
  int64_t out_features() const override { return weight_.shape[0]; }

  Status forward(const TensorView& x, TensorView& y, Stream) const override {
    KILN_RETURN_IF_ERROR(check_activations("input", x, in_features(), name_));
    KILN_RETURN_IF_ERROR(check_activations("output", y, out_features(), name_));
    const int64_t n = x.numel() / in_features();
    if (y.numel() / out_features() != n)
      return invalid_argument("`" + name_ + "`: input " + x.shape_string() + " and output " + y.shape_string() +
                              " have different numbers of rows");
    return cpu::gemm(x.as<const float>(), n, in_features(), weight_.data, weight_.dtype, out_features(), y.as<float>());
  }

  Status dequantize(float* out) const override { return widen_to_f32(weight_, out); }

 private:
  std::string name_;
  TensorView weight_;
};

struct ExpertWeights {
  TensorView gate, up, down;  // [I, H], [I, H], [H, I]
};

class DenseExpertSet final : public ExpertSet {
 public:
  DenseExpertSet(std::string prefix, std::vector<ExpertWeights> experts, int64_t hidden, int64_t inter)
      : prefix_(std::move(prefix)), experts_(std::move(experts)), hidden_(hidden), inter_(inter) {}

  int64_t num_experts() const override { return static_cast<int64_t>(experts_.size()); }
  int64_t hidden_size() const override { return hidden_; }
  int64_t intermediate_size() const override { return inter_; }

  Status forward(const TensorView& x, const int32_t* ids, const float* weights, int top_k, TensorView& y,
                 Stream) const override {
    KILN_RETURN_IF_ERROR(check_activations("input", x, hidden_, prefix_));
    KILN_RETURN_IF_ERROR(check_activations("output", y, hidden_, prefix_));
    const int64_t n = x.numel() / hidden_;
    if (y.numel() != x.numel())
      return invalid_argument("`" + prefix_ + "`: input " + x.shape_string() + " and output " + y.shape_string() +
                              " differ in shape");
    if (top_k < 0) return invalid_argument("`" + prefix_ + "`: top_k must be ≥ 0, got " + std::to_string(top_k));

    // Group the (token, slot) pairs by expert so each expert's weights are read once per call.
    const int64_t e_count = num_experts();
    std::vector<int64_t> start(e_count + 1, 0);
    for (int64_t j = 0; j < n * top_k; ++j) {
      if (ids[j] < 0 || ids[j] >= e_count)
        return out_of_range("`" + prefix_ + "`: expert id " + std::to_string(ids[j]) + " (token " +
                            std::to_string(j / top_k) + ") is outside [0, " + std::to_string(e_count) + ")");
      ++start[ids[j] + 1];
    }
    for (int64_t e = 0; e < e_count; ++e) start[e + 1] += start[e];
    std::vector<int64_t> pairs(n * top_k);
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t j = 0; j < n * top_k; ++j) pairs[fill[ids[j]]++] = j;

    const auto* xs = x.as<const float>();
    float* ys = y.as<float>();
    std::fill(ys, ys + n * hidden_, 0.0f);
    std::vector<float> gathered, gate, up, act, down;
    for (int64_t e = 0; e < e_count; ++e) {
      const int64_t m = start[e + 1] - start[e];
      if (m == 0) continue;
      gathered.resize(m * hidden_);
      gate.resize(m * inter_);
      up.resize(m * inter_);
      act.resize(m * inter_);
      down.resize(m * hidden_);
      for (int64_t r = 0; r < m; ++r) {
        const float* src = xs + (pairs[start[e] + r] / top_k) * hidden_;
        std::copy(src, src + hidden_, gathered.data() + r * hidden_);
      }
      const ExpertWeights& w = experts_[e];
      KILN_RETURN_IF_ERROR(cpu::gemm(gathered.data(), m, hidden_, w.gate.data, w.gate.dtype, inter_, gate.data()));
      KILN_RETURN_IF_ERROR(cpu::gemm(gathered.data(), m, hidden_, w.up.data, w.up.dtype, inter_, up.data()));
      cpu::swiglu(gate.data(), up.data(), m, inter_, inter_, act.data());
      KILN_RETURN_IF_ERROR(cpu::gemm(act.data(), m, inter_, w.down.data, w.down.dtype, hidden_, down.data()));
      for (int64_t r = 0; r < m; ++r) {
        const int64_t pair = pairs[start[e] + r];
        const float scale = weights[pair];
        float* dst = ys + (pair / top_k) * hidden_;
        const float* src = down.data() + r * hidden_;
        for (int64_t i = 0; i < hidden_; ++i) dst[i] += scale * src[i];
      }
    }
    return ok_status();
  }

 private:
  std::string prefix_;
  std::vector<ExpertWeights> experts_;
  int64_t hidden_, inter_;
};

class DenseWeightFormat final : public WeightFormat {
 public:
  Result<std::unique_ptr<Linear>> load_linear(const WeightSource& source, const std::string& name) override {
    if (source.has(name + ".bias"))
      return unimplemented("`" + name + ".bias`: the `dense` weight format has no bias support (GLM linears have none)");
    KILN_ASSIGN_OR_RETURN(TensorView w, get_matrix(source, name + ".weight", -1, -1));
    return std::unique_ptr<Linear>(new DenseLinear(name, w));
  }

  Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource& source, const std::string& prefix,
                                                  int64_t num_experts) override {
    if (num_experts <= 0)
      return invalid_argument("`" + prefix + "`: num_experts must be positive, got " + std::to_string(num_experts));
    std::vector<ExpertWeights> experts;
    experts.reserve(num_experts);
    int64_t inter = -1, hidden = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      const std::string base = prefix + "." + std::to_string(e) + ".";
      ExpertWeights w;
      KILN_ASSIGN_OR_RETURN(w.gate, get_matrix(source, base + "gate_proj.weight", inter, hidden));
      inter = w.gate.shape[0];
      hidden = w.gate.shape[1];
      KILN_ASSIGN_OR_RETURN(w.up, get_matrix(source, base + "up_proj.weight", inter, hidden));
      KILN_ASSIGN_OR_RETURN(w.down, get_matrix(source, base + "down_proj.weight", hidden, inter));
      experts.push_back(w);
    }
    return std::unique_ptr<ExpertSet>(new DenseExpertSet(prefix, std::move(experts), hidden, inter));
  }
};

}  // namespace

Result<std::unique_ptr<WeightFormat>> create_dense_weight_format(const CreateContext&) {
  return std::unique_ptr<WeightFormat>(new DenseWeightFormat());
}

}  // namespace kiln::builtin
