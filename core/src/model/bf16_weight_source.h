// A WeightSource that serves every F32 / F16 tensor of another source rounded to BF16 (ties to even, as the CUDA
// runner's upload does), and BF16 and integer tensors as stored. The CPU model's bf16 precision loads its
// projections, experts, norms and embedding through it, so it computes with exactly the GPU's weight values.
// Converted tensors are made on first get() and owned here: views from it live as long as this object.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/weight_format.h"

namespace kiln {

class Bf16WeightSource final : public WeightSource {
 public:
  explicit Bf16WeightSource(const WeightSource& stored) : stored_(stored) {}

  bool has(const std::string& name) const override { return stored_.has(name); }
  Result<TensorView> get(const std::string& name) const override;

 private:
  const WeightSource& stored_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::vector<uint16_t>> rounded_;
};

}  // namespace kiln
