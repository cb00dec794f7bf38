#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// x's values as bf16 rounds them: bf16 input as is, fp32 input rounded to nearest even on the way in.
__device__ __forceinline__ float bf16_value(uint16_t v) { return bf16_bits_to_float(v); }
__device__ __forceinline__ float bf16_value(float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }

// One block per row (x rows x_stride apart). With a residual, the sum is formed and stored first; the row is
// re-read from L1/L2 for the scale pass (hidden sizes are a few thousand values).
template <bool kResidual, typename In>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const In* __restrict__ x, int64_t x_stride,
                                                           float* __restrict__ residual,
                                                           const uint16_t* __restrict__ weight, int64_t dim, float eps,
                                                           uint16_t* __restrict__ out) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  const int64_t row = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  const In* xr = x + row * x_stride;
  float* rr = kResidual ? residual + row * dim : nullptr;
  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    float v = bf16_value(xr[i]);
    if constexpr (kResidual) {
      v += rr[i];
      rr[i] = v;
    }
    sum_sq += v * v;
  }
  const float total = Reduce(temp).Sum(sum_sq);
  if (threadIdx.x == 0) inv_rms = rsqrtf(total / static_cast<float>(dim) + eps);
  __syncthreads();
  uint16_t* orow = out + row * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = kResidual ? rr[i] : bf16_value(xr[i]);
    orow[i] = float_to_bf16_bits(bf16_bits_to_float(weight[i]) * (v * inv_rms));
  }
}

Status check_shape(int64_t n, int64_t dim, const char* name) {
  if (n < 0 || dim <= 0) return invalid_argument(std::string(name) + ": need n ≥ 0 and dim > 0");
  return ok_status();
}

}  // namespace

Status rmsnorm_bf16(const uint16_t* x, const uint16_t* weight, int64_t n, int64_t dim, float eps, uint16_t* out,
                    StreamHandle stream) {
  KILN_RETURN_IF_ERROR(check_shape(n, dim, "cuda::rmsnorm_bf16"));
  if (n == 0) return ok_status();
  return check_cuda(launch_pdl(rmsnorm_kernel<false, uint16_t>, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0,
                                stream, x, dim, static_cast<float*>(nullptr), weight, dim, eps, out),
                    "cuda::rmsnorm_bf16");
}

Status rmsnorm_rounded_f32_bf16(const float* x, int64_t x_stride, const uint16_t* weight, int64_t n, int64_t dim,
                                float eps, uint16_t* out, StreamHandle stream) {
  KILN_RETURN_IF_ERROR(check_shape(n, dim, "cuda::rmsnorm_rounded_f32_bf16"));
  if (x_stride < dim) return invalid_argument("cuda::rmsnorm_rounded_f32_bf16: need x_stride ≥ dim");
  if (n == 0) return ok_status();
  return check_cuda(launch_pdl(rmsnorm_kernel<false, float>, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0,
                                stream, x, x_stride, static_cast<float*>(nullptr), weight, dim, eps, out),
                    "cuda::rmsnorm_rounded_f32_bf16");
}

Status add_rmsnorm_bf16(const uint16_t* x, float* residual, const uint16_t* weight, int64_t n, int64_t dim, float eps,
                        uint16_t* out, StreamHandle stream) {
  KILN_RETURN_IF_ERROR(check_shape(n, dim, "cuda::add_rmsnorm_bf16"));
  if (n == 0) return ok_status();
  return check_cuda(launch_pdl(rmsnorm_kernel<true, uint16_t>, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0,
                                stream, x, dim, residual, weight, dim, eps, out),
                    "cuda::add_rmsnorm_bf16");
}

}  // namespace kiln::cuda
