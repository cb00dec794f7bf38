// SwiGLU on the GPU (semantics of cpu::swiglu).
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// out[t, i] = silu(min(gate[t, i], limit)) · clamp(up[t, i], −limit, limit); rows of gate / up start at
// t · in_stride (a fused [n, 2·inter] gate|up buffer: up = gate + inter, in_stride = 2·inter). bf16 in and out.
Status swiglu_bf16(const uint16_t* gate, const uint16_t* up, int64_t n, int64_t inter, int64_t in_stride,
                   uint16_t* out, StreamHandle stream, float limit = std::numeric_limits<float>::infinity());

}  // namespace kiln::cuda
