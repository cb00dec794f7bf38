// WeightFormat: turns checkpoint tensors into executable linear layers and expert sets on a device.
// `dense` (built in) serves bf16/fp16/fp32 weights as stored on the CPU and as bf16 on CUDA; quantized formats
// (EXL3) are plugins. Activations: fp32 on the CPU (the reference arithmetic), bf16 on CUDA.
//
// Every object has a plan/run split: what `run` needs beyond its operands (workspace bytes for up to `max_rows`
// rows) is asked once, before a step's buffers are carved, so `run` allocates nothing, never synchronises with
// the host and can be captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

// The core's view of a checkpoint: tensors by their Hugging Face name, as stored on disk (host memory).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual Result<TensorView> get(const std::string& name) const = 0;
  // A source with no data (model.load = "dummy", for benchmarks): formats make weights of the requested shapes
  // themselves, random from seed() (uniform with std 0.02, HF's initializer_range), so speed is measured on the
  // shapes of a model that need not exist on disk. has() is true for every name then; get() fails.
  virtual bool synthetic() const { return false; }
  virtual uint64_t seed() const { return 0; }
};

// What a model asks a format for: the modules whose weights stack, in this order, along the output dimension
// into one Linear (e.g. q_a_proj and kv_a_proj_with_mqa, which read the same input; gate_proj and up_proj).
// Each module's tensors are "<name>.weight" and whatever else the format stores under that prefix.
struct LinearSpec {
  std::vector<std::string> names;
  std::vector<int64_t> out_features;  // per name
  int64_t in_features = 0;
  int64_t total_out() const {
    int64_t s = 0;
    for (int64_t o : out_features) s += o;
    return s;
  }
};

// What a Linear may apply to its output before storing it.
enum class Epilogue {
  kNone,
  // The output's first half g and second half u become silu(min(g, limit)) · clamp(u, −limit, limit), each half
  // rounded to the output dtype first: a fused gate_up projection of a SwiGLU MLP, y [n, out / 2].
  kSwiGLU,
};

struct LinearRun {
  TensorView x;  // [n, in]: fp32 on the CPU, bf16 on CUDA, contiguous
  TensorView y;  // [n, out] (kSwiGLU: [n, out / 2]): fp32 on the CPU; bf16 or fp32 on CUDA
  Epilogue epilogue = Epilogue::kNone;
  float swiglu_limit = std::numeric_limits<float>::infinity();
  bool accumulate = false;      // y += x·Wᵀ (sum in fp32, then rounded to y's dtype); not with an epilogue
  void* workspace = nullptr;    // workspace_bytes(n, epilogue) bytes on the linear's device
  size_t workspace_bytes = 0;
};

// y = x · Wᵀ for W [out, in] (nn.Linear's layout).
class Linear {
 public:
  virtual ~Linear() = default;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual Device device() const = 0;
  // Bytes of device memory this linear holds (weights, scales), for the capacity report.
  virtual size_t bytes() const = 0;
  // Whether run() takes this epilogue (else the caller applies it: SwiGLU over a plain [n, out] output).
  virtual bool supports(Epilogue e) const { return e == Epilogue::kNone; }
  virtual size_t workspace_bytes(int64_t max_rows, Epilogue e) const { return 0; }
  // Batch invariance: up to this many rows, each row's output is bitwise the same whatever other rows share the
  // call (speculative verification relies on it to be lossless). 0: no such bound is promised.
  virtual int64_t batch_invariant_rows() const { return 0; }
  virtual Status run(const LinearRun& args, Stream stream) const = 0;
  // The weight as a dense [out, in] matrix into `out` (fp32 or bf16, host or this linear's device): MLA
  // absorbs kv_b_proj's per-head blocks into the queries and needs them as plain matrices.
  virtual Status dequantize(TensorView out, Stream stream) const = 0;
  // The stored weight when it already is a dense [out, in] matrix on the linear's device (no copy needed), so
  // callers that read W directly (absorption GEMMs, fused expert launches) can skip dequantize(); data == null
  // otherwise.
  virtual TensorView dense_weight() const { return {}; }
};

// A MoE layer's routed experts, each SwiGLU: down(silu(gate(x)) · up(x)), stored under
// "<prefix>.<e>.{gate,up,down}_proj" (per-expert modules) or stacked as the format prefers.
struct ExpertSpec {
  std::string prefix;  // e.g. "model.layers.1.mlp.experts"
  int64_t num_experts = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
};

// The router's decision for n tokens, on the activations' device (made by the core).
struct MoeRouting {
  int top_k = 0;
  const int32_t* ids = nullptr;      // [n, top_k] expert ids; pair p = t·top_k + j is token t's j-th expert
  const float* weights = nullptr;    // [n, top_k] routing weights (scaling included)
  // Pairs grouped by expert (CUDA; null on the CPU): pairs of expert e are order[offsets[e] .. offsets[e + 1]),
  // in pair order; active lists the experts with pairs, ascending, −1 after the last. All on the device.
  const int32_t* offsets = nullptr;  // [E + 1]
  const int32_t* active = nullptr;   // [E]
  const int32_t* order = nullptr;    // [n · top_k]
};

struct ExpertRun {
  TensorView x;  // [n, hidden]: fp32 on the CPU, bf16 on CUDA
  MoeRouting routing;
  float* pair_out = nullptr;  // [n · top_k, hidden] fp32: weights[p] · expert_{ids[p]}(x[t]); the caller sums a token's
  float swiglu_limit = std::numeric_limits<float>::infinity();
  // A shared expert (gate_up stacked [2·I', hidden], down [hidden, I'], loaded through the same format) that the
  // set may compute in its own launches as one more expert of weight 1 per token (dense formats fold it into the
  // routed launches). Optional; see run()'s result.
  const Linear* shared_gate_up = nullptr;
  const Linear* shared_down = nullptr;
  float* shared_out = nullptr;  // [n, hidden] fp32, written when the set computes the shared expert
  void* workspace = nullptr;    // workspace_bytes(n, top_k) bytes on the set's device
  size_t workspace_bytes = 0;
};

class ExpertSet {
 public:
  virtual ~ExpertSet() = default;
  virtual int64_t num_experts() const = 0;
  virtual int64_t hidden_size() const = 0;
  virtual int64_t intermediate_size() const = 0;
  virtual Device device() const = 0;
  virtual size_t bytes() const = 0;
  virtual size_t workspace_bytes(int64_t max_tokens, int top_k) const { return 0; }
  // Up to this many tokens each token's pair outputs are bitwise independent of the other tokens (0: none promised).
  virtual int64_t batch_invariant_rows() const { return 0; }
  // Returns whether it computed the shared expert into shared_out (false: the caller runs it). The answer depends
  // only on the shapes (n, the linears), so a captured graph replays the same choice.
  virtual Result<bool> run(const ExpertRun& args, Stream stream) const = 0;
};

class WeightFormat {
 public:
  static constexpr PluginKind kKind = PluginKind::kWeightFormat;
  virtual ~WeightFormat() = default;
  // On the device of the CreateContext the format was made with (its DeviceContext holds the memory).
  virtual Result<std::unique_ptr<Linear>> load_linear(const WeightSource& source, const LinearSpec& spec) = 0;
  virtual Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource& source, const ExpertSpec& spec) = 0;
};

}  // namespace kiln
