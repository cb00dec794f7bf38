// An in-memory WeightSource for the built-in capability tests.
#pragma once

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/half_float.h"
#include "kiln/weight_format.h"

namespace kiln::test {

class FakeWeightSource : public WeightSource {
 public:
  // Stores `values` (fp32) as a [rows, cols] tensor of `dtype` (F32 or BF16); returns the values as stored.
  std::vector<float> add(const std::string& name, int64_t rows, int64_t cols, const std::vector<float>& values,
                         DType dtype = DType::kBF16) {
    Entry& e = entries_[name];
    std::vector<float> stored = values;
    if (dtype == DType::kBF16) {
      e.bytes.resize(values.size() * 2);
      auto* p = reinterpret_cast<uint16_t*>(e.bytes.data());
      for (size_t i = 0; i < values.size(); ++i) {
        p[i] = cpu::float_to_bf16(values[i]);
        stored[i] = cpu::bf16_to_float(p[i]);
      }
    } else {
      e.bytes.resize(values.size() * dtype_size(dtype));
      if (dtype == DType::kF32) std::memcpy(e.bytes.data(), values.data(), e.bytes.size());
    }
    e.view = TensorView::contiguous(e.bytes.data(), dtype, {rows, cols});
    return stored;
  }
  void add_view(const std::string& name, TensorView view) { entries_[name].view = view; }

  bool has(const std::string& name) const override { return entries_.count(name) != 0; }
  Result<TensorView> get(const std::string& name) const override {
    auto it = entries_.find(name);
    if (it == entries_.end()) return not_found("no tensor " + name);
    return it->second.view;
  }

 private:
  struct Entry {
    std::vector<unsigned char> bytes;
    TensorView view;
  };
  std::map<std::string, Entry> entries_;
};

// A source with no data (model.load = "dummy").
class SyntheticSourceForTest : public WeightSource {
 public:
  bool has(const std::string&) const override { return true; }
  Result<TensorView> get(const std::string& name) const override { return not_found("synthetic: " + name); }
  bool synthetic() const override { return true; }
};

}  // namespace kiln::test
