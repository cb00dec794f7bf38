// An in-memory checkpoint for the exl3 tests, and the test encoder of specs/exl3.md §6: random trellis words (every
// bit pattern is a valid encoding) with random fp16 sign × scale vectors make a valid EXL3 module of any K.
#pragma once

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "exl3_codebook.h"
#include "exl3_half.h"
#include "kiln/weight_format.h"

namespace kiln::exl3::test {

class MemorySource : public WeightSource {
 public:
  template <class T>
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
    Entry& e = entries_[name];
    e.bytes.resize(values.size() * sizeof(T));
    std::memcpy(e.bytes.data(), values.data(), e.bytes.size());
    e.view = TensorView{};
    e.view.data = e.bytes.data();
    e.view.dtype = dtype;
    e.view.rank = static_cast<int>(shape.size());
    int64_t stride = 1;
    for (int k = e.view.rank - 1; k >= 0; --k) {
      e.view.shape[k] = shape[k];
      e.view.strides[k] = stride;
      stride *= shape[k];
    }
  }
  void erase(const std::string& name) { entries_.erase(name); }
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

struct ModuleOptions {
  int bits = 4;
  Codebook codebook = Codebook::k3Inst;
  bool legacy_signs = false;  // .su / .sv instead of .suh / .svh
  bool bias = false;
};

inline int64_t padded(int64_t v) { return (v + 127) / 128 * 128; }

inline std::vector<uint16_t> random_halves(std::mt19937& rng, int64_t n, float lo, float hi, bool random_sign) {
  std::uniform_real_distribution<float> mag(lo, hi);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& h : v) h = float_to_half((random_sign && (rng() & 1u)) ? -mag(rng) : mag(rng));
  return v;
}

// Adds module `name` ([out, in] in HF terms) to `source` with random codes.
inline void add_random_module(MemorySource& source, const std::string& name, int64_t in, int64_t out,
                              const ModuleOptions& o, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t k = padded(in), n = padded(out);
  std::vector<uint16_t> trellis(static_cast<size_t>(k / 16 * n / 16 * 16 * o.bits));
  for (auto& w : trellis) w = static_cast<uint16_t>(rng());
  source.add(name + ".trellis", DType::kI16, {k / 16, n / 16, 16 * o.bits}, trellis);
  if (o.legacy_signs) {
    std::vector<uint16_t> su(static_cast<size_t>(k / 16)), sv(static_cast<size_t>(n / 16));
    for (auto& w : su) w = static_cast<uint16_t>(rng());
    for (auto& w : sv) w = static_cast<uint16_t>(rng());
    source.add(name + ".su", DType::kI16, {k / 16}, su);
    source.add(name + ".sv", DType::kI16, {n / 16}, sv);
  } else {
    // Scales of the magnitude a quantizer leaves (weights ~0.02 / codebook RMS ~1.2, split across both sides).
    source.add(name + ".suh", DType::kF16, {k}, random_halves(rng, k, 0.05f, 0.2f, true));
    source.add(name + ".svh", DType::kF16, {n}, random_halves(rng, n, 0.05f, 0.2f, true));
  }
  if (o.codebook == Codebook::kMcg) source.add(name + ".mcg", DType::kI32, {}, std::vector<uint32_t>{kMcgMultiplier});
  if (o.codebook == Codebook::kMul1)
    source.add(name + ".mul1", DType::kI32, {}, std::vector<uint32_t>{kMul1Multiplier});
  if (o.bias) source.add(name + ".bias", DType::kF16, {out}, random_halves(rng, out, 0.0f, 0.5f, true));
}

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace kiln::exl3::test
