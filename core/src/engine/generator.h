// Single-sequence generation over a loaded model: chunked prefill, then one token per step, with stop
// tokens and a token callback for streaming. The serving engine batches many of these; this is what
// `kiln generate` and the reference tests use.
#pragma once

#include <functional>
#include <vector>

#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "model/kv_cache.h"
#include "model/mla_moe_model.h"

namespace kiln {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  int64_t prefill_chunk = 2048;            // scheduler.max_num_batched_tokens
  std::vector<int32_t> stop_tokens;        // generation ends after emitting one of these
  SamplingOptions sampling;
};

struct GenerateStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  bool stopped_by_token = false;
};

class Generator {
 public:
  // With `runner` (e.g. the CUDA runner, whose pages mirror kv's block ids), steps run through it and `kv` only
  // hands out the block table; `model` then supplies the config.
  Generator(const MlaMoeModel& model, KvCache& kv, ModelRunner* runner = nullptr)
      : model_(model), kv_(kv), runner_(runner) {}
  ~Generator() { kv_.release(table_); }

  // Returns the generated ids (stop token included when one ended it). `on_token` sees each as it comes;
  // returning false from it stops generation.
  Result<std::vector<int32_t>> generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                        const std::function<bool(int32_t)>& on_token, GenerateStats* stats = nullptr);

 private:
  const MlaMoeModel& model_;
  KvCache& kv_;
  ModelRunner* runner_;
  std::vector<int32_t> table_;
};

}  // namespace kiln
