#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row. With a residual, the sum is formed and stored first; the row is re-read from L1/L2 for the
// scale pass (hidden sizes are a few thousand values).
template <bool kResidual>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const uint16_t* __restrict__ x, float* __restrict__ residual,
                                                           const uint16_t* __restrict__ weight, int64_t dim, float eps,
                                                           uint16_t* __restrict__ out) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  const int64_t row = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  const uint16_t* xr = x + row * dim;
  float* rr = kResidual ? residual + row * dim : nullptr;
  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    float v = bf16_bits_to_float(xr[i]);
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
    const float v = kResidual ? rr[i] : bf16_bits_to_float(xr[i]);
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
  return check_cuda(launch_pdl(rmsnorm_kernel<false>, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, x,
                                static_cast<float*>(nullptr), weight, dim, eps, out),
                    "cuda::rmsnorm_bf16");
}

Status add_rmsnorm_bf16(const uint16_t* x, float* residual, const uint16_t* weight, int64_t n, int64_t dim, float eps,
                        uint16_t* out, StreamHandle stream) {
  KILN_RETURN_IF_ERROR(check_shape(n, dim, "cuda::add_rmsnorm_bf16"));
  if (n == 0) return ok_status();
  return check_cuda(launch_pdl(rmsnorm_kernel<true>, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, x,
                                residual, weight, dim, eps, out),
                    "cuda::add_rmsnorm_bf16");
}

}  // namespace kiln::cuda
