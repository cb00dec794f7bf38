#include "vision_kernels.h"

#include <cfloat>

namespace kiln::vision::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? b : 65535 * 16);
}

// Sum (or max) over the block; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // `shared` may still be read by an earlier reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : (kMax ? -FLT_MAX : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  return v;
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += b[i % cols];
}

__global__ void add_into_kernel(float* x, const float* y, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void rms_norm_kernel(const float* x, float* y, const float* w, int64_t width, float eps) {
  __shared__ float shared[32];
  const float* xr = x + blockIdx.x * width;
  float* yr = y + blockIdx.x * width;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += xr[i] * xr[i];
  sum = block_reduce<false>(sum, shared);
  const float inv = rsqrtf(sum / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

// One block per (row, q or k, head); the head's values staged in shared memory for the rotate-half pairing.
__global__ void qk_norm_rope_kernel(float* qkv, const float* q_norm, const float* k_norm, const float* cos_t,
                                    const float* sin_t, int64_t heads, int64_t hd, float eps) {
  extern __shared__ float vals[];
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, part = blockIdx.y / heads, head = blockIdx.y % heads;
  float* v = qkv + row * 3 * heads * hd + part * heads * hd + head * hd;
  const float* w = part == 0 ? q_norm : k_norm;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
    vals[i] = v[i];
    sum += vals[i] * vals[i];
  }
  sum = block_reduce<false>(sum, shared);
  const float inv = rsqrtf(sum / static_cast<float>(hd) + eps);
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) vals[i] = w[i] * (vals[i] * inv);
  __syncthreads();
  const int64_t half = hd / 2;
  const float* c = cos_t + row * hd;
  const float* s = sin_t + row * hd;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
    const float r = i < half ? -vals[i + half] : vals[i - half];
    v[i] = vals[i] * c[i] + r * s[i];
  }
}

__global__ void softmax_kernel(float* s, int64_t cols) {
  __shared__ float shared[32];
  float* row = s + blockIdx.x * cols;
  float top = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) top = fmaxf(top, row[j]);
  top = block_reduce<true>(top, shared);
  float total = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = expf(row[j] - top);
    row[j] = e;
    total += e;
  }
  total = block_reduce<false>(total, shared);
  const float inv = 1.0f / total;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) row[j] *= inv;
}

__global__ void clamped_swiglu_kernel(float* gate, const float* up, int64_t count, float lim) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = fminf(gate[i], lim);
    const float u = fminf(fmaxf(up[i], -lim), lim);
    gate[i] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void layer_norm_kernel(float* x, const float* w, const float* b, int64_t width, float eps) {
  __shared__ float shared[32];
  float* xr = x + blockIdx.x * width;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += xr[i];
  const float mean = block_reduce<false>(sum, shared) / static_cast<float>(width);
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) var += (xr[i] - mean) * (xr[i] - mean);
  var = block_reduce<false>(var, shared) / static_cast<float>(width);
  const float inv = rsqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) xr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

__global__ void gelu_kernel(float* x, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

}  // namespace

void add_bias(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  add_bias_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(y, b, rows, cols);
}

void add_into(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  add_into_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, y, count);
}

void rms_norm_rows(const float* x, float* y, const float* w, int64_t rows, int64_t width, float eps,
                   cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, y, w, width, eps);
}

void qk_norm_rope(float* qkv, const float* q_norm, const float* k_norm, const float* cos_t, const float* sin_t,
                  int64_t n, int64_t heads, int64_t head_dim, float eps, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = head_dim >= 128 ? 128 : 64;
  qk_norm_rope_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(2 * heads)), threads,
                        static_cast<size_t>(head_dim) * sizeof(float), stream>>>(qkv, q_norm, k_norm, cos_t, sin_t,
                                                                                 heads, head_dim, eps);
}

void softmax_rows(float* s, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(s, cols);
}

void clamped_swiglu(float* gate, const float* up, int64_t count, float limit, cudaStream_t stream) {
  if (count == 0) return;
  clamped_swiglu_kernel<<<blocks_for(count), kThreads, 0, stream>>>(gate, up, count, limit);
}

void layer_norm_rows(float* x, const float* w, const float* b, int64_t rows, int64_t width, float eps,
                     cudaStream_t stream) {
  if (rows == 0) return;
  layer_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, w, b, width, eps);
}

void gelu(float* x, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  gelu_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, count);
}

}  // namespace kiln::vision::cuda
