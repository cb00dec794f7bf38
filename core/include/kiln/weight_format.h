// WeightFormat: turns checkpoint tensors into executable linear layers and expert sets.
// `dense` (built in) serves bf16/fp16/fp32 weights as stored; quantized formats (EXL3) are plugins.
#pragma once

#include <memory>
#include <string>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

// The core's view of a checkpoint: tensors by their Hugging Face name, as stored on disk (host memory).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual Result<TensorView> get(const std::string& name) const = 0;
};

// y[n, out] = x[n, in] · Wᵀ. On the CPU, x and y are fp32 and contiguous.
class Linear {
 public:
  virtual ~Linear() = default;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual Status forward(const TensorView& x, TensorView& y, Stream stream) const = 0;
  // The weight as fp32 [out, in]; the core needs it for MLA absorption (W_UK, W_UV per head).
  virtual Status dequantize(float* out) const = 0;
};

// A MoE layer's routed experts, each SwiGLU: down(silu(gate(x)) · up(x)).
class ExpertSet {
 public:
  virtual ~ExpertSet() = default;
  virtual int64_t num_experts() const = 0;
  virtual int64_t hidden_size() const = 0;
  virtual int64_t intermediate_size() const = 0;
  // For each of n tokens: y[i] = Σ_j weights[i·top_k + j] · Expert_{ids[i·top_k + j]}(x[i]).
  // x [n, hidden] and y [n, hidden] fp32 on the CPU; y is overwritten.
  virtual Status forward(const TensorView& x, const int32_t* ids, const float* weights, int top_k, TensorView& y,
                         Stream stream) const = 0;
};

class WeightFormat {
 public:
  static constexpr PluginKind kKind = PluginKind::kWeightFormat;
  virtual ~WeightFormat() = default;
  // `name` is the module's prefix, e.g. "model.layers.0.self_attn.q_a_proj" (its tensors are "<name>.weight", ...).
  virtual Result<std::unique_ptr<Linear>> load_linear(const WeightSource& source, const std::string& name) = 0;
  // `prefix` is e.g. "model.layers.1.mlp.experts" (experts "<prefix>.<e>.{gate,up,down}_proj").
  virtual Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource& source, const std::string& prefix,
                                                          int64_t num_experts) = 0;
};

}  // namespace kiln
