#include "exl3_synthetic.h"

#include <cmath>
#include <functional>

namespace kiln::exl3 {
namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr float kMcgRms = 1.2441f;  // RMS of the MCG codebook over all 65,536 states (specs/exl3.md §4)

std::vector<float> signs(int64_t count, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    v[i] = (splitmix64(seed + static_cast<uint64_t>(i)) & 1u) ? -synthetic_scale() : synthetic_scale();
  return v;
}

}  // namespace

float synthetic_scale() { return std::sqrt(0.02f / kMcgRms); }

uint64_t synthetic_seed(uint64_t source_seed, const std::string& name) {
  return source_seed ^ (std::hash<std::string>{}(name) * 0x9E3779B97F4A7C15ull);
}

SyntheticModule make_synthetic_module(const std::string& name, int64_t in, int64_t out, int bits, uint64_t source_seed) {
  SyntheticModule s;
  Module& m = s.module;
  m.name = name;
  m.in = in, m.out = out, m.bits = bits, m.codebook = Codebook::kMcg;
  m.k_pad = (in + 127) / 128 * 128, m.n_pad = (out + 127) / 128 * 128;
  const uint64_t seed = synthetic_seed(source_seed, name);
  const int64_t words = m.k_pad / 16 * m.n_pad / 16 * 8 * bits;  // uint32 stream words
  s.trellis = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(2 * words));
  for (int64_t i = 0; i < words; ++i) {
    const auto w = static_cast<uint32_t>(splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull)));
    (*s.trellis)[2 * i] = static_cast<uint16_t>(w & 0xFFFFu);  // the little-endian halves of the stream word
    (*s.trellis)[2 * i + 1] = static_cast<uint16_t>(w >> 16);
  }
  m.trellis = s.trellis->data();
  m.suh = signs(m.k_pad, seed + 1);
  m.svh = signs(m.n_pad, seed + 2);
  return s;
}

}  // namespace kiln::exl3
