// One token's logit adjustment before selection, in a header of its own so the CUDA kernel that applies it
// (kernels/cuda/logit_adjust) shares the struct without the rest of the step's types.
#pragma once

#include <cstdint>

namespace kiln {

// x → rep(x + bias) + add, rep(y) = y / repetition when y > 0 and y · repetition otherwise (repetition 1 leaves it).
// The engine's sampling penalties and logit_bias (engine/sampling_penalties.h).
struct LogitAdjustment {
  int32_t token = 0;
  float bias = 0.0f;
  float repetition = 1.0f;
  float add = 0.0f;
};

}  // namespace kiln
