// Interleaved rotary embedding on the GPU, in place (layout and order of kernels/cpu/rope.h: pairs
// (x[2i], x[2i+1]) rotated by frequency i and written de-interleaved, out[i] / out[half + i]).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// The rope slice of (token t, head h) starts at x + t·token_stride + h·head_stride (elements). Angles are
// float(positions[t]) · inv_freq[i] in fp32 (inv_freq: device [rotary_dim/2], from cpu::rope_inv_freq), and
// cos/sin are multiplied by attention_factor, as cpu::rope_cos_sin. rotary_dim even, ≤ 128.
Status apply_rope_interleaved_f32(float* x, int64_t n, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                                  const int64_t* positions, const float* inv_freq, float attention_factor,
                                  int64_t rotary_dim, StreamHandle stream);
Status apply_rope_interleaved_bf16(uint16_t* x, int64_t n, int64_t num_heads, int64_t token_stride,
                                   int64_t head_stride, const int64_t* positions, const float* inv_freq,
                                   float attention_factor, int64_t rotary_dim, StreamHandle stream);

}  // namespace kiln::cuda
