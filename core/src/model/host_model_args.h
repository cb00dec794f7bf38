// The argument checks of a CPU ModelInstance's drafter pieces (embed, lm_head), shared by every architecture's CPU
// instance so they refuse the same calls with the same words.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

// Host fp32 [n, hidden] rows out, every id inside the vocabulary.
inline Status check_host_embed_args(const int32_t* ids, int64_t n, const TensorView& out, int64_t vocab,
                                    int64_t hidden) {
  if (!out.device.is_cpu() || out.dtype != DType::kF32 || out.numel() != n * hidden)
    return invalid_argument("CPU embedding rows go to host fp32 [n, hidden]");
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return invalid_argument("token id " + std::to_string(ids[i]) + " is outside the vocabulary");
  return ok_status();
}

// Host fp32 [n, hidden] rows in.
inline Status check_host_lm_head_args(const TensorView& hidden, int64_t hidden_size) {
  if (!hidden.device.is_cpu() || hidden.dtype != DType::kF32 || hidden.dim(-1) != hidden_size)
    return invalid_argument("the CPU lm_head takes host fp32 [n, hidden]");
  return ok_status();
}

}  // namespace kiln
