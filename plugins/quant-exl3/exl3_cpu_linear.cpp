#include "exl3_cpu_linear.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "exl3_half.h"

namespace kiln::exl3 {
namespace {

float widen(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<const float>()[i];
    case DType::kBF16: return std::bit_cast<float>(static_cast<uint32_t>(t.as<const uint16_t>()[i]) << 16);
    case DType::kF16: return half_to_float(t.as<const uint16_t>()[i]);
    default: return 0.0f;
  }
}

uint16_t float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

Result<TensorView> dense_tensor(const WeightSource& source, const std::string& tensor, int64_t rows, int64_t cols) {
  KILN_ASSIGN_OR_RETURN(TensorView t, source.get(tensor));
  const bool shape_ok = cols < 0 ? (t.rank == 1 && t.shape[0] == rows)
                                 : (t.rank == 2 && t.shape[0] == rows && t.shape[1] == cols);
  if (!shape_ok)
    return invalid_argument("tensor `" + tensor + "` has shape " + t.shape_string() + ", the config implies [" +
                            std::to_string(rows) + (cols < 0 ? "" : ", " + std::to_string(cols)) + "]");
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
    return invalid_argument("tensor `" + tensor + "` is " + dtype_name(t.dtype) + "; an unquantized module must be "
                            "F32, BF16 or F16");
  if (!t.device.is_cpu() || !t.is_contiguous())
    return invalid_argument("tensor `" + tensor + "` must be a contiguous host tensor");
  return t;
}

// y[n, out] = x · Wᵀ (+ bias) for a dense part: one dot product per output in a fixed order (batch-invariant).
void dense_forward(const Part& p, const float* x, int64_t n, int64_t in, float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < p.out; ++o) {
    std::vector<float> w(static_cast<size_t>(in));
    for (int64_t i = 0; i < in; ++i) w[i] = widen(p.dense, o * in + i);
    const float b = p.dense_bias.data ? widen(p.dense_bias, o) : 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      float acc = 0.0f;
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[i];
      y[r * p.out + o] = acc + b;
    }
  }
}

class CpuLinear final : public Linear {
 public:
  CpuLinear(std::vector<Part> parts, int64_t in) : parts_(std::move(parts)), in_(in) {
    for (const Part& p : parts_) out_ += p.out;
  }

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  Device device() const override { return Device::cpu(); }
  size_t bytes() const override {  // trellis and dense weights stay in the checkpoint's mapping; the scales are ours
    size_t b = 0;
    for (const Part& p : parts_)
      if (p.quantized) b += 4 * (p.quantized->suh.size() + p.quantized->svh.size() + p.quantized->bias.size());
    return b;
  }
  int64_t batch_invariant_rows() const override { return INT64_MAX; }

  Status run(const LinearRun& a, Stream) const override {
    const std::string& name = parts_[0].name;
    if (a.epilogue != Epilogue::kNone) return unimplemented("`" + name + "`: the CPU `exl3` format fuses no epilogue");
    for (const auto& [what, t, width] : {std::tuple{"input", a.x, in_}, std::tuple{"output", a.y, out_}})
      if (!t.device.is_cpu() || t.dtype != DType::kF32 || !t.is_contiguous() || t.rank < 1 || t.dim(-1) != width)
        return invalid_argument("`" + name + "`: " + what + " must be contiguous host F32 [..., " +
                                std::to_string(width) + "], got " + dtype_name(t.dtype) + " " + t.shape_string());
    const int64_t n = a.x.numel() / in_;
    if (a.y.numel() / out_ != n)
      return invalid_argument("`" + name + "`: input " + a.x.shape_string() + " and output " + a.y.shape_string() +
                              " have different numbers of rows");
    const float* x = a.x.as<const float>();
    float* y = a.y.as<float>();
    std::vector<float> part;
    int64_t col = 0;
    for (const Part& p : parts_) {
      part.resize(static_cast<size_t>(n * p.out));
      if (p.quantized)
        forward(*p.quantized, x, n, part.data());
      else
        dense_forward(p, x, n, in_, part.data());
      for (int64_t r = 0; r < n; ++r) {
        float* dst = y + r * out_ + col;
        const float* src = part.data() + r * p.out;
        if (a.accumulate)
          for (int64_t i = 0; i < p.out; ++i) dst[i] += src[i];
        else
          std::copy_n(src, p.out, dst);
      }
      col += p.out;
    }
    return ok_status();
  }

  Status dequantize(TensorView out, Stream) const override {
    if (!out.device.is_cpu() || out.numel() != out_ * in_ || !out.is_contiguous() ||
        (out.dtype != DType::kF32 && out.dtype != DType::kBF16))
      return invalid_argument("`" + parts_[0].name + "`: dequantize needs a contiguous host F32 or BF16 [" +
                              std::to_string(out_) + ", " + std::to_string(in_) + "] buffer");
    int64_t row = 0;
    for (const Part& p : parts_) {
      std::vector<float> w;
      if (p.quantized) {
        w = exl3::dequantize(*p.quantized);
      } else {
        w.resize(static_cast<size_t>(p.out * in_));
        for (int64_t i = 0; i < p.out * in_; ++i) w[i] = widen(p.dense, i);
      }
      const int64_t at = row * in_;
      for (size_t i = 0; i < w.size(); ++i) {
        if (out.dtype == DType::kF32)
          out.as<float>()[at + i] = w[i];
        else
          out.as<uint16_t>()[at + i] = float_to_bf16(w[i]);
      }
      row += p.out;
    }
    return ok_status();
  }

 private:
  std::vector<Part> parts_;
  int64_t in_ = 0, out_ = 0;
};

class CpuExpertSet final : public ExpertSet {
 public:
  CpuExpertSet(std::string prefix, std::vector<ExpertLinears> experts, int64_t hidden, int64_t inter)
      : prefix_(std::move(prefix)), experts_(std::move(experts)), hidden_(hidden), inter_(inter) {}

  int64_t num_experts() const override { return static_cast<int64_t>(experts_.size()); }
  int64_t hidden_size() const override { return hidden_; }
  int64_t intermediate_size() const override { return inter_; }
  Device device() const override { return Device::cpu(); }
  size_t bytes() const override {
    size_t b = 0;
    for (const auto& e : experts_) b += e.gate->bytes() + e.up->bytes() + e.down->bytes();
    return b;
  }
  int64_t batch_invariant_rows() const override { return INT64_MAX; }

  Result<bool> run(const ExpertRun& a, Stream stream) const override {
    if (!a.x.device.is_cpu() || a.x.dtype != DType::kF32 || !a.x.is_contiguous() || a.x.rank < 1 ||
        a.x.dim(-1) != hidden_)
      return invalid_argument("`" + prefix_ + "`: input must be contiguous host F32 [..., " + std::to_string(hidden_) +
                              "], got " + dtype_name(a.x.dtype) + " " + a.x.shape_string());
    const int64_t n = a.x.numel() / hidden_;
    const int top_k = a.routing.top_k;
    if (top_k < 0) return invalid_argument("`" + prefix_ + "`: top_k must be ≥ 0, got " + std::to_string(top_k));
    const int64_t pairs = n * top_k;
    if (pairs > 0 && (!a.routing.ids || !a.routing.weights || !a.pair_out))
      return invalid_argument("`" + prefix_ + "`: routing ids, weights and pair_out are required");
    const int64_t e_count = num_experts();
    // Pairs grouped by expert, in pair order, so each expert's trellis is decoded once per call.
    std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(e_count));
    for (int64_t p = 0; p < pairs; ++p) {
      const int32_t e = a.routing.ids[p];
      if (e < 0 || e >= e_count)
        return out_of_range("`" + prefix_ + "`: expert id " + std::to_string(e) + " (token " +
                            std::to_string(p / top_k) + ") is outside [0, " + std::to_string(e_count) + ")");
      by_expert[e].push_back(p);
    }
    const float* xs = a.x.as<const float>();
    std::vector<float> x, gate, up, act, down;
    for (int64_t e = 0; e < e_count; ++e) {
      const auto& list = by_expert[e];
      const int64_t m = static_cast<int64_t>(list.size());
      if (m == 0) continue;
      x.resize(m * hidden_), gate.resize(m * inter_), up.resize(m * inter_), act.resize(m * inter_);
      down.resize(m * hidden_);
      for (int64_t r = 0; r < m; ++r) std::copy_n(xs + (list[r] / top_k) * hidden_, hidden_, &x[r * hidden_]);
      const ExpertLinears& w = experts_[e];
      KILN_RETURN_IF_ERROR(w.gate->run(linear_run(x, gate, m, hidden_, inter_), stream));
      KILN_RETURN_IF_ERROR(w.up->run(linear_run(x, up, m, hidden_, inter_), stream));
      // SwiGLU with the SDK's clamp: silu(min(g, limit)) · clamp(u, −limit, limit).
      const float limit = a.swiglu_limit;
      for (int64_t i = 0; i < m * inter_; ++i) {
        const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
        act[i] = g / (1.0f + std::exp(-g)) * u;
      }
      KILN_RETURN_IF_ERROR(w.down->run(linear_run(act, down, m, inter_, hidden_), stream));
      for (int64_t r = 0; r < m; ++r) {
        const float scale = a.routing.weights[list[r]];
        float* dst = a.pair_out + list[r] * hidden_;
        for (int64_t i = 0; i < hidden_; ++i) dst[i] = scale * down[r * hidden_ + i];
      }
    }
    return false;  // the shared expert is the caller's
  }

 private:
  static LinearRun linear_run(std::vector<float>& x, std::vector<float>& y, int64_t m, int64_t in, int64_t out) {
    LinearRun r;
    r.x = TensorView::contiguous(x.data(), DType::kF32, {m, in});
    r.y = TensorView::contiguous(y.data(), DType::kF32, {m, out});
    return r;
  }

  std::string prefix_;
  std::vector<ExpertLinears> experts_;
  int64_t hidden_, inter_;
};

}  // namespace

Result<Part> read_part(const WeightSource& source, const std::string& name, int64_t in, int64_t out) {
  Part p;
  p.name = name;
  p.out = out;
  if (has_exl3_tensors(source, name)) {
    KILN_ASSIGN_OR_RETURN(Module m, read_module(source, name, in, out));
    p.quantized = std::move(m);
    return p;
  }
  if (!source.has(name + ".weight"))
    return not_found("module `" + name + "` is in the checkpoint neither as EXL3 (`" + name + ".trellis`) nor dense (`" +
                     name + ".weight`)");
  KILN_ASSIGN_OR_RETURN(p.dense, dense_tensor(source, name + ".weight", out, in));
  if (source.has(name + ".bias")) {
    KILN_ASSIGN_OR_RETURN(p.dense_bias, dense_tensor(source, name + ".bias", out, -1));
  }
  return p;
}

Result<std::unique_ptr<Linear>> make_cpu_linear(std::vector<Part> parts, int64_t in) {
  if (parts.empty()) return invalid_argument("a linear layer was requested with no module");
  return std::unique_ptr<Linear>(new CpuLinear(std::move(parts), in));
}

std::unique_ptr<ExpertSet> make_cpu_expert_set(std::string prefix, std::vector<ExpertLinears> experts, int64_t hidden,
                                               int64_t inter) {
  return std::unique_ptr<ExpertSet>(new CpuExpertSet(std::move(prefix), std::move(experts), hidden, inter));
}

}  // namespace kiln::exl3
