#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/rope.h"

namespace kiln::cuda {
namespace {

__device__ __forceinline__ float load_value(const float* p) { return *p; }
__device__ __forceinline__ float load_value(const uint16_t* p) { return bf16_bits_to_float(*p); }
__device__ __forceinline__ void store_value(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_value(uint16_t* p, float v) { *p = float_to_bf16_bits(v); }

constexpr int kMaxPairsPerLane = 2;  // rotary_dim ≤ 128

// One warp per (token, head): every lane reads its pairs before any lane writes, so the in-place
// de-interleaving cannot read an overwritten value.
template <class T>
__global__ void rope_interleaved_kernel(T* x, int64_t rows, int64_t num_heads, int64_t token_stride,
                                        int64_t head_stride, const int64_t* __restrict__ positions,
                                        const float* __restrict__ inv_freq, float attention_factor, int half) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t t = row / num_heads;
  const int64_t h = row % num_heads;
  T* v = x + t * token_stride + h * head_stride;
  const float position = static_cast<float>(positions[t]);
  float even[kMaxPairsPerLane], odd[kMaxPairsPerLane];
#pragma unroll
  for (int k = 0; k < kMaxPairsPerLane; ++k) {
    const int i = lane + 32 * k;
    if (i < half) {
      even[k] = load_value(v + 2 * i);
      odd[k] = load_value(v + 2 * i + 1);
    }
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < kMaxPairsPerLane; ++k) {
    const int i = lane + 32 * k;
    if (i < half) {
      // Same rounding as the CPU: fp32 angle, fp64 cos/sin rounded once, then the fp32 attention factor.
      const double angle = static_cast<double>(position * inv_freq[i]);
      const float c = static_cast<float>(cos(angle)) * attention_factor;
      const float s = static_cast<float>(sin(angle)) * attention_factor;
      store_value(v + i, even[k] * c - odd[k] * s);
      store_value(v + half + i, odd[k] * c + even[k] * s);
    }
  }
}

template <class T>
Status launch_rope(T* x, int64_t n, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                   const int64_t* positions, const float* inv_freq, float attention_factor, int64_t rotary_dim,
                   StreamHandle stream, const char* name) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > 64 * kMaxPairsPerLane)
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
