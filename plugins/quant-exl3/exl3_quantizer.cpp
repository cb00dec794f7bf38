#include "exl3_quantizer.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "exl3_encoder.h"
#include "exl3_half.h"
#include "exl3_module.h"
#include "exl3_tile.h"
#include "kiln/log.h"
#include "kiln/quantizer.h"
#ifdef KILN_EXL3_WITH_CUDA
#include "exl3_viterbi_cuda.h"
#endif

namespace kiln::exl3 {
namespace {

constexpr const char* kDefaultCodebook = "mul1";  // upstream's default since mid 2026 (specs/exl3.md §2)

Result<Codebook> parse_codebook(const std::string& name) {
  const std::string n = name.empty() ? kDefaultCodebook : name;
  if (n == "mcg") return Codebook::kMcg;
  if (n == "mul1") return Codebook::kMul1;
  if (n == "3inst") return Codebook::k3Inst;
  return invalid_argument("unknown EXL3 codebook `" + name + "` (choose mcg, mul1 or 3inst)");
}

template <class T>
QuantizedTensor tensor(const char* suffix, DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  QuantizedTensor t;
  t.suffix = suffix;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * sizeof(T));
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

// ‖W − dequantize(encoded)‖ / ‖W‖ through the plugin's own decoder: the number the user sees is what loads.
double relative_error(const EncodedMatrix& e, Codebook cb, const float* w, int64_t out, int64_t in) {
  Module m;
  m.in = in;
  m.out = out;
  m.k_pad = e.k_pad;
  m.n_pad = e.n_pad;
  m.bits = e.bits;
  m.codebook = cb;
  m.trellis = e.trellis.data();
  for (uint16_t h : e.suh) m.suh.push_back(half_to_float(h));
  for (uint16_t h : e.svh) m.svh.push_back(half_to_float(h));
  const std::vector<float> d = dequantize(m);
  double err = 0, ref = 0;
  for (int64_t i = 0; i < out * in; ++i) {
    err += (double(d[i]) - w[i]) * (double(d[i]) - w[i]);
    ref += double(w[i]) * w[i];
  }
  return ref > 0 ? std::sqrt(err / ref) : std::sqrt(err);
}

class Exl3Quantizer final : public Quantizer {
 public:
  Status check(const QuantizeOptions& o) const override {
    if (o.bits < min_bits() || o.bits > max_bits())
      return invalid_argument("EXL3 stores 1..8 bits per weight, got " + std::to_string(o.bits));
    return parse_codebook(o.codebook).status();
  }

  int64_t work_units(int64_t out, int64_t in) const override { return tile_count(out, in); }

  Result<QuantizedWeight> quantize(const TensorView& w, const QuantizeOptions& o,
                                   const std::function<void(int64_t)>& progress) override {
    KILN_RETURN_IF_ERROR(check(o));
    if (w.rank != 2 || w.dtype != DType::kF32 || !w.is_contiguous() || !w.device.is_cpu())
      return invalid_argument("the EXL3 quantizer takes a contiguous fp32 [out, in] CPU tensor, got " +
                              std::string(dtype_name(w.dtype)) + " " + w.shape_string());
    KILN_ASSIGN_OR_RETURN(Codebook cb, parse_codebook(o.codebook));
    EncodeOptions eo;
    eo.bits = o.bits;
    eo.codebook = cb;
    eo.seed = o.seed;
    eo.threads = o.threads;
#ifdef KILN_EXL3_WITH_CUDA
    // The trellis search on the GPU where there is one (the same bytes as the CPU's; KILN_EXL3_VITERBI=cpu keeps it
    // on the CPU). K = 1 stays on the CPU, and after a failure (no memory left beside another process, say) so does
    // the rest of the run: said once.
    if (o.bits >= 2 && !device_failed_ && cuda::viterbi_device_usable())
      eo.tile_search = [this, cb](const float* targets, int64_t tiles, int bits, const float* values,
                                  uint8_t* symbols) {
        if (device_failed_) return false;
        // Values decoded in registers where that was faster on the H200 (K = 2: 1.31×; K = 8: 2.0×, a block's
        // threads mostly waiting on L2 there), the table elsewhere (K = 3..6: 1-7 % faster); the same bits either way.
        const int decode = bits <= 2 || bits >= 7 ? static_cast<int>(cb) : -1;
        const std::string error = cuda::viterbi_tiles(targets, tiles, bits, values, symbols, nullptr, decode);
        if (error.empty()) return true;
        device_failed_ = true;
        log::warn("exl3 quantizer: the GPU trellis search failed ({}); searching on the CPU from here on", error);
        return false;
      };
#endif
    const int64_t out = w.shape[0], in = w.shape[1];
    const float* data = w.as<const float>();
    EncodedMatrix e = encode_matrix(data, out, in, eo, progress);
    QuantizedWeight q;
    q.tensors.push_back(tensor("trellis", DType::kI16, {e.k_pad / 16, e.n_pad / 16, 16 * int64_t(e.bits)}, e.trellis));
    q.tensors.push_back(tensor("suh", DType::kF16, {e.k_pad}, e.suh));
    q.tensors.push_back(tensor("svh", DType::kF16, {e.n_pad}, e.svh));
    if (cb == Codebook::kMcg) q.tensors.push_back(tensor("mcg", DType::kI32, {}, std::vector<uint32_t>{kMcgMultiplier}));
    if (cb == Codebook::kMul1)
      q.tensors.push_back(tensor("mul1", DType::kI32, {}, std::vector<uint32_t>{kMul1Multiplier}));
    q.relative_error = relative_error(e, cb, data, out, in);
    return q;
  }

  std::string quantization_config(const QuantizeSummary& s) const override {
    const std::string codebook = s.options.codebook.empty() ? kDefaultCodebook : s.options.codebook;
    char bits[32];
    std::snprintf(bits, sizeof bits, "%.4g", s.average_bits);
    // No calibration data: the encoder minimises each weight's own error (no Hessian), hence rows = cols = 0.
    return std::string("{\"quant_method\": \"exl3\", \"version\": \"kiln-quant-exl3 0.1.0\", \"bits\": ") + bits +
           ", \"head_bits\": " + std::to_string(s.head_bits == 0 ? 16 : s.head_bits) + ", \"codebook\": \"" +
           codebook + "\", \"calibration\": {\"rows\": 0, \"cols\": 0}, \"out_scales\": \"always\"}";
  }

  int min_bits() const override { return 1; }
  int max_bits() const override { return kMaxBits; }

 private:
  std::atomic<bool> device_failed_{false};
};

Result<std::unique_ptr<Quantizer>> create_exl3_quantizer(const CreateContext&) {
  return std::unique_ptr<Quantizer>(new Exl3Quantizer());
}

}  // namespace

Status register_exl3_quantizer(Registrar& registrar) {
  return registrar.add<Quantizer>("exl3",
                                  "EXL3 encoder: Hadamard both sides, Viterbi per 16x16 tile with tail-biting "
                                  "(no Hessian), multithreaded CPU",
                                  &create_exl3_quantizer, DeviceSet::cpu());
}

}  // namespace kiln::exl3
