// The committed transformers fixtures: tests/data/models/<name> holds a tiny model's config and weights and
// reference.safetensors (tools/make_reference.py: the prompts and the logits transformers 5.17 computed for them).
// Shared by the CPU reference tests, the speculative tests and the GPU tests that compare against the CPU path.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/safetensors_file.h"

namespace kiln::testing {

inline std::filesystem::path model_dir(const std::string& name) {
  return std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/models" / name;
}

// A fixture's reference.safetensors: fp32 tensors (logits) and id lists (prompts, I64 or I32 on disk).
struct Reference {
  SafetensorsFile file;
  std::vector<float> floats(const std::string& name) const {
    auto t = file.get(name);
    EXPECT_TRUE(t.ok()) << name;
    if (!t.ok()) return {};
    const float* p = t->as<const float>();
    return {p, p + t->numel()};
  }
  std::vector<int32_t> ids(const std::string& name) const {
    auto t = file.get(name);
    EXPECT_TRUE(t.ok()) << name;
    if (!t.ok()) return {};
    std::vector<int32_t> out(t->numel());
    for (int64_t i = 0; i < t->numel(); ++i)
      out[i] = t->dtype == DType::kI64 ? static_cast<int32_t>(t->as<const int64_t>()[i]) : t->as<const int32_t>()[i];
    return out;
  }
};

// max|a − b| / max|b| over n values (infinite when a has a non-finite value): the logits tolerance measure.
inline double relative_error(const float* a, const float* b, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

// max|a − b| over two equal-length runs of values (the caller checks the lengths).
inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

inline Reference load_reference(const std::string& name) {
  auto f = SafetensorsFile::open(model_dir(name) / "reference.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return Reference{std::move(f).value()};
}

}  // namespace kiln::testing
