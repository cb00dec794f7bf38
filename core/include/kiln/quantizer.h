// The quantizer seam: a plugin that can write a weight format can also offer to produce it from dense weights
// (`kiln quantize --format NAME`).
//
// The interface is one 2-D weight at a time, on purpose: the core's `kiln quantize` owns everything that is the
// same for every format (reading the HF checkpoint, choosing which tensors to convert, shards, copying the
// tokenizer, the progress bar, resuming a killed run), so the SDK needs no checkpoint or file types, and a
// format plugin only does the math it alone knows. The plugin parallelises inside one weight as it likes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

struct QuantizeOptions {
  int bits = 4;              // bits per weight of this tensor (the head may get other bits than the body)
  std::string codebook;      // format-specific variant name ("" = the format's default)
  uint64_t seed = 0;         // the core derives one per tensor from its name: same input → same bytes
  int threads = 0;           // CPU threads to use (0 = the implementation's default)
};

// One tensor to store as `<module>.<suffix>` (the module is the weight's name without `.weight`).
struct QuantizedTensor {
  std::string suffix;
  DType dtype = DType::kI16;
  std::vector<int64_t> shape;   // {} = a 0-dim scalar
  std::vector<uint8_t> bytes;   // little-endian, row-major
};

struct QuantizedWeight {
  std::vector<QuantizedTensor> tensors;
  double relative_error = -1;   // ‖W − dequantized‖ / ‖W‖ where the format can tell (−1: not measured)
};

// What config.json's quantization_config is written from.
struct QuantizeSummary {
  QuantizeOptions options;      // the body's options
  double average_bits = 0;      // over the quantized decoder weights
  int head_bits = 0;            // 0 = the head was not quantized
};

class Quantizer {
 public:
  static constexpr PluginKind kKind = PluginKind::kQuantizer;
  virtual ~Quantizer() = default;

  // Refuses options this format cannot honour (bits out of range, unknown codebook) before any work starts.
  virtual Status check(const QuantizeOptions& options) const = 0;
  // Units of work for a weight [out, in], the unit `progress` counts (for a rate on the progress bar).
  virtual int64_t work_units(int64_t out, int64_t in) const = 0;
  // `weight`: contiguous fp32 [out, in] on the CPU (the core converts bf16/fp16). `progress(units)` is called on
  // the calling thread with the units finished since the last call. The result replaces `<module>.weight`
  // (a `.bias` is the core's to copy).
  virtual Result<QuantizedWeight> quantize(const TensorView& weight, const QuantizeOptions& options,
                                           const std::function<void(int64_t)>& progress) = 0;
  // The `quantization_config` object for config.json, as JSON text.
  virtual std::string quantization_config(const QuantizeSummary& summary) const = 0;
  // The smallest and largest bits the format stores, and the value that means "leave the head dense".
  virtual int min_bits() const = 0;
  virtual int max_bits() const = 0;
};

}  // namespace kiln
