#include "exl3_cuda_format.h"

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "exl3_cpu_linear.h"
#include "exl3_cuda_objects.h"
#include "exl3_half.h"
#include "exl3_kernels.h"
#include "exl3_module.h"
#include "exl3_synthetic.h"

namespace kiln::exl3::cuda {
namespace {

int64_t padded(int64_t v) { return (v + 127) / 128 * 128; }

uint16_t to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float widen(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<const float>()[i];
    case DType::kBF16: return std::bit_cast<float>(static_cast<uint32_t>(t.as<const uint16_t>()[i]) << 16);
    case DType::kF16: return half_to_float(t.as<const uint16_t>()[i]);
    default: return 0.0f;
  }
}

class CudaWeightFormat final : public WeightFormat {
 public:
  CudaWeightFormat(DeviceContext& dev, WeightFormat* dense, SyntheticModules synthetic)
      : dev_(dev), dense_(dense), synthetic_(synthetic) {}

  Result<std::unique_ptr<Linear>> load_linear(const WeightSource& source, const LinearSpec& spec) override {
    if (spec.names.empty() || spec.names.size() != spec.out_features.size() || spec.in_features <= 0)
      return invalid_argument("`exl3`: malformed linear request (" + std::to_string(spec.names.size()) + " names, " +
                              std::to_string(spec.out_features.size()) + " output sizes, in_features " +
                              std::to_string(spec.in_features) + ")");
    // A stack stored dense runs the core's dense kernels (skinny GEMM, cuBLAS, fused epilogues); a stack mixing
    // EXL3 and dense modules stays here, in one Linear.
    if (dense_ && (source.synthetic() ? synthetic_.experts_only : all_stored_dense(source, spec.names)))
      return dense_->load_linear(source, spec);
    std::vector<DevicePart> parts;
    for (size_t i = 0; i < spec.names.size(); ++i) {
      if (spec.out_features[i] <= 0) return invalid_argument("`" + spec.names[i] + "`: out_features must be positive");
      KILN_ASSIGN_OR_RETURN(DevicePart p, load_part(source, spec.names[i], spec.in_features, spec.out_features[i]));
      parts.push_back(std::move(p));
    }
    return make_cuda_linear(dev_, std::move(parts), spec.in_features);
  }

  Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource& source, const ExpertSpec& spec) override {
    const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
    if (E <= 0 || H <= 0 || I <= 0)
      return invalid_argument("`" + spec.prefix + "`: experts, hidden and intermediate sizes must be positive");
    if (dense_ && !source.synthetic() && experts_stored_dense(source, spec.prefix, E))
      return dense_->load_experts(source, spec);
    DeviceExperts experts;
    for (int64_t e = 0; e < E; ++e) {
      const std::string base = spec.prefix + "." + std::to_string(e) + ".";
      for (const auto& [proj, list, in, out] :
           {std::tuple{"gate_proj", &experts.gate, H, I}, std::tuple{"up_proj", &experts.up, H, I},
            std::tuple{"down_proj", &experts.down, I, H}}) {
        KILN_ASSIGN_OR_RETURN(DevicePart p, load_part(source, base + proj, in, out));
        if (!p.quantized)
          return unimplemented("`" + base + proj + "` is dense: the CUDA `exl3` expert kernels serve a layer's experts "
                               "all quantized or (through the built-in format) all dense, not a mix");
        list->push_back(*p.quantized);
      }
    }
    return make_cuda_expert_set(dev_, spec.prefix, std::move(experts), H, I);
  }

 private:
  Result<void*> upload(const void* host, size_t bytes, const std::string& what) {
    KILN_ASSIGN_OR_RETURN(void* mem, dev_.allocate(bytes, what.c_str()));
    KILN_RETURN_IF_ERROR(dev_.copy(mem, host, bytes, /*wait=*/true));
    return mem;
  }

  Result<DevicePart> load_part(const WeightSource& source, const std::string& name, int64_t in, int64_t out) {
    if (source.synthetic()) return synthetic_part(source, name, in, out);
    KILN_ASSIGN_OR_RETURN(Part host, read_part(source, name, in, out));
    DevicePart p;
    p.name = name;
    p.out = out;
    if (host.quantized) {
      const Module& m = *host.quantized;
      DeviceModule d;
      d.in = in, d.out = out, d.k_pad = m.k_pad, d.n_pad = m.n_pad, d.bits = m.bits;
      d.codebook = static_cast<int>(m.codebook);
      const size_t trellis_bytes = static_cast<size_t>(m.k_pad / 16 * m.n_pad / 16 * 16 * m.bits) * 2;
      KILN_ASSIGN_OR_RETURN(void* t, upload(m.trellis, trellis_bytes, name + ".trellis"));
      d.trellis = static_cast<const uint32_t*>(t);
      KILN_ASSIGN_OR_RETURN(void* su, upload(m.suh.data(), m.suh.size() * 4, name + ".suh"));
      KILN_ASSIGN_OR_RETURN(void* sv, upload(m.svh.data(), m.svh.size() * 4, name + ".svh"));
      d.suh = static_cast<const float*>(su), d.svh = static_cast<const float*>(sv);
      if (!m.bias.empty()) {
        KILN_ASSIGN_OR_RETURN(void* b, upload(m.bias.data(), m.bias.size() * 4, name + ".bias"));
        d.bias = static_cast<const float*>(b);
      }
      p.quantized = d;
      return p;
    }
    // A module the quantizer left dense: bf16 on the device, like the built-in `dense` format holds it.
    std::vector<uint16_t> w(static_cast<size_t>(out * in));
    for (int64_t i = 0; i < out * in; ++i) w[i] = to_bf16(widen(host.dense, i));
    KILN_ASSIGN_OR_RETURN(void* wd, upload(w.data(), w.size() * 2, name + ".weight"));
    p.dense = static_cast<const uint16_t*>(wd);
    if (host.dense_bias.data) {
      std::vector<float> b(static_cast<size_t>(out));
      for (int64_t i = 0; i < out; ++i) b[i] = widen(host.dense_bias, i);
      KILN_ASSIGN_OR_RETURN(void* bd, upload(b.data(), b.size() * 4, name + ".bias"));
      p.dense_bias = static_cast<const float*>(bd);
    }
    return p;
  }

  // model.load = "dummy": an EXL3 module of the requested shape made on the device (any trellis payload is valid),
  // the same words and scales as the CPU's (exl3_synthetic.h).
  Result<DevicePart> synthetic_part(const WeightSource& source, const std::string& name, int64_t in, int64_t out) {
    DevicePart p;
    p.name = name;
    p.out = out;
    DeviceModule d;
    d.in = in, d.out = out, d.k_pad = padded(in), d.n_pad = padded(out), d.bits = synthetic_.bits;
    d.codebook = static_cast<int>(Codebook::kMcg);
    const int64_t words = d.k_pad / 16 * d.n_pad / 16 * 8 * d.bits;
    const uint64_t seed = synthetic_seed(source.seed(), name);  // as the CPU's make_synthetic_module
    KILN_ASSIGN_OR_RETURN(void* t, dev_.allocate(static_cast<size_t>(words) * 4, (name + ".trellis").c_str()));
    KILN_ASSIGN_OR_RETURN(void* su, dev_.allocate(static_cast<size_t>(d.k_pad) * 4, (name + ".suh").c_str()));
    KILN_ASSIGN_OR_RETURN(void* sv, dev_.allocate(static_cast<size_t>(d.n_pad) * 4, (name + ".svh").c_str()));
    void* stream = dev_.stream().handle;
    for (const char* error : {fill_random_words(static_cast<uint32_t*>(t), words, seed, stream),
                              fill_random_signs(static_cast<float*>(su), d.k_pad, synthetic_scale(), seed + 1, stream),
                              fill_random_signs(static_cast<float*>(sv), d.n_pad, synthetic_scale(), seed + 2, stream)})
      if (error) return internal_error("`" + name + "`: generating dummy EXL3 weights: " + error);
    d.trellis = static_cast<const uint32_t*>(t), d.suh = static_cast<const float*>(su);
    d.svh = static_cast<const float*>(sv);
    p.quantized = d;
    return p;
  }

  DeviceContext& dev_;
  WeightFormat* dense_;
  SyntheticModules synthetic_;
};

}  // namespace

std::unique_ptr<WeightFormat> make_cuda_weight_format(DeviceContext& dev, WeightFormat* dense,
                                                      SyntheticModules synthetic) {
  return std::unique_ptr<WeightFormat>(new CudaWeightFormat(dev, dense, synthetic));
}

}  // namespace kiln::exl3::cuda
