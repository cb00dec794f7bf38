#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/pdl.cuh"
#include "kiln/cuda/rmsnorm_row.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// x's values as bf16 rounds them: bf16 input as is, fp32 input rounded to nearest even on the way in.
__device__ __forceinline__ float bf16_value(uint16_t v) { return bf16_bits_to_float(v); }
__device__ __forceinline__ float bf16_value(float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }

// One block per row (x rows x_stride apart); kPer > 0: the row in registers (rmsnorm_row_regs), 0: rmsnorm_row.
template <bool kResidual, typename In, int kPer>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const In* __restrict__ x, int64_t x_stride,
                                                           float* __restrict__ residual,
                                                           const uint16_t* __restrict__ weight, int64_t dim, float eps,
                                                           uint16_t* __restrict__ out) {
  const int64_t row = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  const In* xr = x + row * x_stride;
  float* res = kResidual ? residual + row * dim : nullptr;
  if constexpr (kPer > 0) {
    rmsnorm_row_regs<kThreads, kPer, kResidual>(
        [&](float (&v)[kPer]) {
#pragma unroll
          for (int j = 0; j < kPer; ++j) {
            const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
            if (i < dim) v[j] = bf16_value(xr[i]);
          }
        },
        res, weight, dim, eps, out + row * dim);
  } else {
    rmsnorm_row<kThreads, kResidual>([&](int64_t i) { return bf16_value(xr[i]); }, res, weight, dim, eps,
                                     out + row * dim);
  }
}

// rmsnorm_kernel for a row of `dim` values: the register form where the row fits.
template <bool kResidual, typename In>
auto rmsnorm_kernel_for(int64_t dim) {
  switch (rmsnorm_row_values(dim, kThreads)) {
    case 4: return rmsnorm_kernel<kResidual, In, 4>;
    case 8: return rmsnorm_kernel<kResidual, In, 8>;
    case 16: return rmsnorm_kernel<kResidual, In, 16>;
    case 32: return rmsnorm_kernel<kResidual, In, 32>;
    default: return rmsnorm_kernel<kResidual, In, 0>;
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
  return check_cuda(launch_pdl(rmsnorm_kernel_for<false, uint16_t>(dim), dim3(static_cast<unsigned>(n)), dim3(kThreads), 0,
                                stream, x, dim, static_cast<float*>(nullptr), weight, dim, eps, out),
                    "cuda::rmsnorm_bf16");
}

Status rmsnorm_rounded_f32_bf16(const float* x, int64_t x_stride, const uint16_t* weight, int64_t n, int64_t dim,
                                float eps, uint16_t* out, StreamHandle stream) {
  KILN_RETURN_IF_ERROR(check_shape(n, dim, "cuda::rmsnorm_rounded_f32_bf16"));
  if (x_stride < dim) return invalid_argument("cuda::rmsnorm_rounded_f32_bf16: need x_stride ≥ dim");
  if (n == 0) return ok_status();
  return check_cuda(launch_pdl(rmsnorm_kernel_for<false, float>(dim), dim3(static_cast<unsigned>(n)), dim3(kThreads), 0,
                                stream, x, x_stride, static_cast<float*>(nullptr), weight, dim, eps, out),
                    "cuda::rmsnorm_rounded_f32_bf16");
}

Status add_rmsnorm_bf16(const uint16_t* x, float* residual, const uint16_t* weight, int64_t n, int64_t dim, float eps,
                        uint16_t* out, StreamHandle stream) {
  KILN_RETURN_IF_ERROR(check_shape(n, dim, "cuda::add_rmsnorm_bf16"));
  if (n == 0) return ok_status();
  return check_cuda(launch_pdl(rmsnorm_kernel_for<true, uint16_t>(dim), dim3(static_cast<unsigned>(n)), dim3(kThreads), 0,
                                stream, x, dim, residual, weight, dim, eps, out),
                    "cuda::add_rmsnorm_bf16");
}

}  // namespace kiln::cuda
