#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_device.cuh"

namespace kiln::cuda {
namespace {

// One warp per (token, head).
template <class T>
__global__ void rope_interleaved_kernel(T* x, int64_t rows, int64_t num_heads, int64_t token_stride,
                                        int64_t head_stride, const int64_t* __restrict__ positions,
                                        const float* __restrict__ inv_freq, float attention_factor, int half) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= rows) return;
  const int64_t t = row / num_heads;
  const int64_t h = row % num_heads;
  rope_slice_warp(x + t * token_stride + h * head_stride, static_cast<float>(positions[t]), inv_freq,
                  attention_factor, half, static_cast<int>(threadIdx.x % 32));
}

template <class T>
Status launch_rope(T* x, int64_t n, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                   const int64_t* positions, const float* inv_freq, float attention_factor, int64_t rotary_dim,
                   StreamHandle stream, const char* name) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > 64 * kRopeMaxPairsPerLane)
    return invalid_argument(std::string(name) + ": rotary_dim must be even and in (0, 128], got " +
                            std::to_string(rotary_dim));
  const int64_t rows = n * num_heads;
  if (rows <= 0) return ok_status();
  constexpr int kThreads = 256;
  rope_interleaved_kernel<T><<<blocks_for(rows * 32, kThreads), kThreads, 0, stream>>>(
      x, rows, num_heads, token_stride, head_stride, positions, inv_freq, attention_factor,
      static_cast<int>(rotary_dim / 2));
  return check_launch(name);
}

}  // namespace

Status apply_rope_interleaved_f32(float* x, int64_t n, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                                  const int64_t* positions, const float* inv_freq, float attention_factor,
                                  int64_t rotary_dim, StreamHandle stream) {
  return launch_rope(x, n, num_heads, token_stride, head_stride, positions, inv_freq, attention_factor, rotary_dim,
                     stream, "cuda::apply_rope_interleaved_f32");
}

Status apply_rope_interleaved_bf16(uint16_t* x, int64_t n, int64_t num_heads, int64_t token_stride,
                                   int64_t head_stride, const int64_t* positions, const float* inv_freq,
                                   float attention_factor, int64_t rotary_dim, StreamHandle stream) {
  return launch_rope(x, n, num_heads, token_stride, head_stride, positions, inv_freq, attention_factor, rotary_dim,
                     stream, "cuda::apply_rope_interleaved_bf16");
}

}  // namespace kiln::cuda
