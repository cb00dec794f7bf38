// Per-request sampling: greedy, or temperature → top-k → top-p with a seeded generator, so a request
// with a seed is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/sampling.h"

namespace kiln {

struct SamplingOptions {
  float temperature = 0.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  // Applied to the logits before selection (greedy included; engine/sampling_penalties.h): OpenAI's presence and
  // frequency penalties over the generated tokens, the repetition penalty (as transformers and vLLM define it) over
  // prompt and generated tokens, and logit_bias (token id, added value).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // 1 = off
  std::vector<std::pair<int32_t, float>> logit_bias;
  float min_p = 0.0f;  // 0 = off; sampled requests only
  bool adjusts_logits() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f || !logit_bias.empty();
  }
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
