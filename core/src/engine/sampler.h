// Per-request sampling: greedy, or temperature → top-k → top-p with a seeded generator, so a request
// with a seed is reproducible.
#pragma once

#include <cstdint>
#include <random>

#include "kernels/cpu/sampling.h"

namespace kiln {

struct SamplingOptions {
  float temperature = 0.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : options_(o), rng_(o.seed) {}
  bool greedy() const { return options_.temperature <= 0.0f; }
  const SamplingOptions& options() const { return options_; }
  cpu::SamplingParams params() const {
    cpu::SamplingParams p;
    p.temperature = options_.temperature;
    p.top_k = options_.top_k;
    p.top_p = options_.top_p;
    return p;
  }
  // The request's generator: speculative verification draws from it too, so a seed fixes the whole output.
  std::mt19937_64& rng() { return rng_; }
  // One uniform in [0, 1) with 53 bits, as cpu::sample_from_distribution draws it: the device's token selection
  // takes these, so a seed gives the same tokens on the CPU and the GPU.
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  int32_t next(const float* logits, int64_t vocab) {
    if (greedy()) return cpu::argmax(logits, vocab);
    return cpu::sample(logits, vocab, params(), rng_);
  }

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace kiln
