#include "model/bf16_weight_source.h"

#include "kernels/cpu/half_float.h"

namespace kiln {

Result<TensorView> Bf16WeightSource::get(const std::string& name) const {
  KILN_ASSIGN_OR_RETURN(TensorView t, stored_.get(name));
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16) return t;
  if (!t.device.is_cpu() || !t.is_contiguous())
    return invalid_argument("tensor `" + name + "` must be a contiguous host tensor to be rounded to bf16");
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = rounded_.try_emplace(name);
  std::vector<uint16_t>& bits = it->second;
  if (fresh) {
    const int64_t n = t.numel();
    bits.resize(static_cast<size_t>(n));
    if (t.dtype == DType::kF32) {
      cpu::float_to_bf16(t.as<const float>(), bits.data(), n);
    } else {
      for (int64_t i = 0; i < n; ++i) bits[i] = cpu::float_to_bf16(cpu::fp16_to_float(t.as<const uint16_t>()[i]));
    }
  }
  // Same shape and (contiguous) strides in elements; only the storage and its dtype change.
  t.data = bits.data();
  t.dtype = DType::kBF16;
  return t;
}

}  // namespace kiln
