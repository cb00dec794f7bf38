// The `dense` weight format on the CPU: views into the checkpoint's mapping, fp32 activations, kernels/cpu/gemm.
#include <algorithm>
#include <string>
#include <vector>

#include "builtin/dense_weight_format.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half_float.h"

namespace kiln::builtin {
namespace {

Status check_activations(const char* what, const TensorView& t, int64_t width, const std::string& layer) {
  if (!t.device.is_cpu())
    return invalid_argument("`" + layer + "`: the CPU `dense` format got its " + what + " on " + t.device.to_string());
  if (t.dtype != DType::kF32 || !t.is_contiguous() || t.rank < 1 || t.dim(-1) != width)
    return invalid_argument("`" + layer + "`: " + what + " must be contiguous F32 [..., " + std::to_string(width) +
                            "], got " + dtype_name(t.dtype) + " " + t.shape_string());
  return ok_status();
}

Status widen(const TensorView& w, float* out) {
  const int64_t n = w.numel();
  switch (w.dtype) {
    case DType::kF32: std::copy(w.as<const float>(), w.as<const float>() + n, out); return ok_status();
    case DType::kBF16: cpu::bf16_to_float(w.as<const uint16_t>(), out, n); return ok_status();
    case DType::kF16: cpu::fp16_to_float(w.as<const uint16_t>(), out, n); return ok_status();
    default: return internal_error("dense weight of unexpected dtype");
  }
}

// One or more stacked modules: y[:, part] = x · W_partᵀ, each part a view into the mapping.
class DenseCpuLinear final : public Linear {
 public:
  DenseCpuLinear(std::string name, std::vector<TensorView> parts) : name_(std::move(name)), parts_(std::move(parts)) {
    for (const auto& p : parts_) out_ += p.shape[0];
  }

  int64_t in_features() const override { return parts_[0].shape[1]; }
  int64_t out_features() const override { return out_; }
  Device device() const override { return Device::cpu(); }
  size_t bytes() const override { return 0; }  // the checkpoint's mapping, not memory of its own
  // Each output is one dot product in a fixed order, whatever the batch.
  int64_t batch_invariant_rows() const override { return INT64_MAX; }

  Status run(const LinearRun& a, Stream) const override {
    if (a.epilogue != Epilogue::kNone) return unimplemented("`" + name_ + "`: the CPU `dense` format fuses no epilogue");
    KILN_RETURN_IF_ERROR(check_activations("input", a.x, in_features(), name_));
    KILN_RETURN_IF_ERROR(check_activations("output", a.y, out_, name_));
    const int64_t n = a.x.numel() / in_features();
    if (a.y.numel() / out_ != n)
      return invalid_argument("`" + name_ + "`: input " + a.x.shape_string() + " and output " + a.y.shape_string() +
                              " have different numbers of rows");
    const auto* x = a.x.as<const float>();
    float* y = a.y.as<float>();
    if (parts_.size() == 1 && !a.accumulate)
      return cpu::gemm(x, n, in_features(), parts_[0].data, parts_[0].dtype, out_, y);
    std::vector<float> part;
    int64_t col = 0;
    for (const TensorView& w : parts_) {
      const int64_t o = w.shape[0];
      part.resize(static_cast<size_t>(n * o));
      KILN_RETURN_IF_ERROR(cpu::gemm(x, n, in_features(), w.data, w.dtype, o, part.data()));
      for (int64_t r = 0; r < n; ++r) {
        float* dst = y + r * out_ + col;
        const float* src = part.data() + r * o;
        if (a.accumulate)
          for (int64_t i = 0; i < o; ++i) dst[i] += src[i];
        else
          std::copy_n(src, o, dst);
      }
      col += o;
    }
    return ok_status();
  }

  Status dequantize(TensorView out, Stream) const override {
    if (!out.device.is_cpu() || out.numel() != out_ * in_features() || !out.is_contiguous())
      return invalid_argument("`" + name_ + "`: dequantize needs a contiguous host [" + std::to_string(out_) + ", " +
                              std::to_string(in_features()) + "] buffer");
    std::vector<float> f;
    int64_t row = 0;
    for (const TensorView& w : parts_) {
      f.resize(static_cast<size_t>(w.numel()));
      KILN_RETURN_IF_ERROR(widen(w, f.data()));
      const size_t at = static_cast<size_t>(row * in_features());
      if (out.dtype == DType::kF32)
        std::copy(f.begin(), f.end(), out.as<float>() + at);
      else if (out.dtype == DType::kBF16)
        cpu::float_to_bf16(f.data(), out.as<uint16_t>() + at, static_cast<int64_t>(f.size()));
      else
        return invalid_argument("`" + name_ + "`: dequantize writes F32 or BF16");
      row += w.shape[0];
    }
    return ok_status();
  }

  TensorView dense_weight() const override {
    if (parts_.size() != 1) return {};
    return parts_[0];
  }

 private:
  std::string name_;
  std::vector<TensorView> parts_;
  int64_t out_ = 0;
};

struct ExpertWeights {
  TensorView gate, up, down;  // [I, H], [I, H], [H, I]
};

class DenseCpuExpertSet final : public ExpertSet {
 public:
  DenseCpuExpertSet(std::string prefix, std::vector<ExpertWeights> experts, int64_t hidden, int64_t inter)
      : prefix_(std::move(prefix)), experts_(std::move(experts)), hidden_(hidden), inter_(inter) {}

  int64_t num_experts() const override { return static_cast<int64_t>(experts_.size()); }
  int64_t hidden_size() const override { return hidden_; }
  int64_t intermediate_size() const override { return inter_; }
  Device device() const override { return Device::cpu(); }
  size_t bytes() const override { return 0; }
  int64_t batch_invariant_rows() const override { return INT64_MAX; }

  Result<bool> run(const ExpertRun& a, Stream) const override {
    KILN_RETURN_IF_ERROR(check_activations("input", a.x, hidden_, prefix_));
    const int64_t n = a.x.numel() / hidden_;
    const int top_k = a.routing.top_k;
    if (top_k < 0) return invalid_argument("`" + prefix_ + "`: top_k must be ≥ 0, got " + std::to_string(top_k));
    if (n * top_k > 0 && (!a.routing.ids || !a.routing.weights || !a.pair_out))
      return invalid_argument("`" + prefix_ + "`: routing ids, weights and pair_out are required");
    const int32_t* ids = a.routing.ids;

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

    const auto* xs = a.x.as<const float>();
    std::vector<float> gathered, gate, up, act, down;
    for (int64_t e = 0; e < e_count; ++e) {
      const int64_t m = start[e + 1] - start[e];
      if (m == 0) continue;
      gathered.resize(m * hidden_), gate.resize(m * inter_), up.resize(m * inter_), act.resize(m * inter_);
      down.resize(m * hidden_);
      for (int64_t r = 0; r < m; ++r) {
        const float* src = xs + (pairs[start[e] + r] / top_k) * hidden_;
        std::copy(src, src + hidden_, gathered.data() + r * hidden_);
      }
      const ExpertWeights& w = experts_[e];
      KILN_RETURN_IF_ERROR(cpu::gemm(gathered.data(), m, hidden_, w.gate.data, w.gate.dtype, inter_, gate.data()));
      KILN_RETURN_IF_ERROR(cpu::gemm(gathered.data(), m, hidden_, w.up.data, w.up.dtype, inter_, up.data()));
      cpu::swiglu(gate.data(), up.data(), m, inter_, inter_, act.data(), a.swiglu_limit);
      KILN_RETURN_IF_ERROR(cpu::gemm(act.data(), m, inter_, w.down.data, w.down.dtype, hidden_, down.data()));
      for (int64_t r = 0; r < m; ++r) {
        const int64_t pair = pairs[start[e] + r];
        const float scale = a.routing.weights[pair];
        float* dst = a.pair_out + pair * hidden_;
        const float* src = down.data() + r * hidden_;
        for (int64_t i = 0; i < hidden_; ++i) dst[i] = scale * src[i];
      }
    }
    return false;  // the shared expert is the caller's
  }

 private:
  std::string prefix_;
  std::vector<ExpertWeights> experts_;
  int64_t hidden_, inter_;
};

class DenseCpuWeightFormat final : public WeightFormat {
 public:
  Result<std::unique_ptr<Linear>> load_linear(const WeightSource& source, const LinearSpec& spec) override {
    KILN_RETURN_IF_ERROR(check_linear_spec(spec));
    if (source.synthetic())
      return unimplemented("`model.load = \"dummy\"` (random weights) is provided on CUDA devices; on the CPU set "
                           "model.load = \"mmap\"");
    std::vector<TensorView> parts;
    for (size_t i = 0; i < spec.names.size(); ++i) {
      const std::string& name = spec.names[i];
      if (source.has(name + ".bias"))
        return unimplemented("`" + name + ".bias`: the `dense` weight format has no bias support (GLM linears have none)");
      KILN_ASSIGN_OR_RETURN(TensorView w, get_dense_matrix(source, name + ".weight", spec.out_features[i], spec.in_features));
      parts.push_back(w);
    }
    return std::unique_ptr<Linear>(new DenseCpuLinear(spec.names[0], std::move(parts)));
  }

  Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource& source, const ExpertSpec& spec) override {
    if (spec.num_experts <= 0)
      return invalid_argument("`" + spec.prefix + "`: num_experts must be positive, got " + std::to_string(spec.num_experts));
    if (source.synthetic())
      return unimplemented("`model.load = \"dummy\"` (random weights) is provided on CUDA devices");
    std::vector<ExpertWeights> experts;
    experts.reserve(spec.num_experts);
    const int64_t I = spec.intermediate, H = spec.hidden;
    for (int64_t e = 0; e < spec.num_experts; ++e) {
      const std::string base = spec.prefix + "." + std::to_string(e) + ".";
      ExpertWeights w;
      KILN_ASSIGN_OR_RETURN(w.gate, get_dense_matrix(source, base + "gate_proj.weight", I, H));
      KILN_ASSIGN_OR_RETURN(w.up, get_dense_matrix(source, base + "up_proj.weight", I, H));
      KILN_ASSIGN_OR_RETURN(w.down, get_dense_matrix(source, base + "down_proj.weight", H, I));
      experts.push_back(w);
    }
    return std::unique_ptr<ExpertSet>(new DenseCpuExpertSet(spec.prefix, std::move(experts), H, I));
  }
};

}  // namespace

Result<std::unique_ptr<WeightFormat>> create_dense_cpu_weight_format(const CreateContext&) {
  return std::unique_ptr<WeightFormat>(new DenseCpuWeightFormat());
}

}  // namespace kiln::builtin
