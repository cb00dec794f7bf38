// The WeightSource of `model.load = "dummy"`: no data, every name present; weight formats make random weights of
// the shapes the architecture asks for (see WeightSource::synthetic), so a model's speed can be measured on shapes
// that need no checkpoint on disk.
#pragma once

#include <string>

#include "kiln/weight_format.h"

namespace kiln {

class SyntheticWeightSource final : public WeightSource {
 public:
  explicit SyntheticWeightSource(uint64_t seed) : seed_(seed) {}
  bool has(const std::string&) const override { return true; }
  Result<TensorView> get(const std::string& name) const override {
    return failed_precondition("`" + name + "` has no data: the model is loaded with model.load = \"dummy\"");
  }
  bool synthetic() const override { return true; }
  uint64_t seed() const override { return seed_; }

 private:
  uint64_t seed_;
};

}  // namespace kiln
