// One request through an Engine, waited for: what `kiln generate`, the CPU benchmark and tests use instead of a
// decode loop of their own (there is one decode loop: BatchEngine's).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/engine_api.h"

namespace kiln {

struct SingleRequestStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0;  // submit → first token
  double decode_seconds = 0;   // first token → last
  bool stopped_by_token = false;
};

// Submits `params`, streams each token to `on_token` (returning false cancels the request), and returns the
// generated ids once the request ends (a stop token included). An engine-side error ends it with that error.
Result<std::vector<int32_t>> run_single_request(Engine& engine, RequestParams params,
                                                const std::function<bool(int32_t)>& on_token = nullptr,
                                                SingleRequestStats* stats = nullptr);

}  // namespace kiln
