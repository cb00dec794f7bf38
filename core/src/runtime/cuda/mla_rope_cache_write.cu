#include "runtime/cuda/mla_rope_cache_write.h"

#include <string>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope_device.cuh"
#include "runtime/cuda/mla_cache_row.cuh"

namespace kiln::cuda {
namespace {

// Block (t, h < heads): query head h of token t; block (t, heads): token t's latent. Warp 0 ropes the slice in
// place as the RoPE kernel does; after the barrier the block reads the roped values back (its own writes).
__global__ void mla_rope_cache_write_kernel(MlaRopeCacheWrite a) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t qk = a.nope + a.rope, D = a.latent + a.rope;
  pdl_wait();
  pdl_launch_dependents();
  // Without positions the rows are already roped (and without a norm weight already normalised).
  const float position = a.positions ? static_cast<float>(a.positions[t]) : 0.0f;
  const int half = a.positions ? static_cast<int>(a.rope / 2) : 0;
  if (h < a.heads) {
    float* v = a.q + (t * a.heads + h) * qk;
    if (threadIdx.x < 32 && half > 0) rope_slice_warp(v + a.nope, position, a.inv_freq, a.attention_factor, half,
                                                      static_cast<int>(threadIdx.x));
    __syncthreads();
    uint16_t* vb = a.q_bf + (t * a.heads + h) * qk;
    for (int64_t i = threadIdx.x; i < qk; i += blockDim.x) vb[i] = float_to_bf16_bits(v[i]);
    float* pe = a.q_abs + (t * a.heads + h) * D + a.latent;
    for (int64_t i = threadIdx.x; i < a.rope; i += blockDim.x) pe[i] = v[a.nope + i];
    return;
  }
  float* row = a.ckv + t * (a.ckv_stride > 0 ? a.ckv_stride : D);
  if (threadIdx.x < 32 && half > 0)
    rope_slice_warp(row + a.latent, position, a.inv_freq, a.attention_factor, half, static_cast<int>(threadIdx.x));
  __syncthreads();
  if (a.cache == nullptr) {  // finish the row in place for a layout that stores final rows
    if (a.norm_weight) mla_normalize_row(row, a.latent, a.norm_weight, a.eps);
    return;
  }
  if (a.slots[t] < 0) return;  // padding
  mla_write_cache_row(row, a.latent, a.rope, a.norm_weight, a.eps, a.cache + a.slots[t] * D);
}

}  // namespace

Status mla_rope_cache_write(const MlaRopeCacheWrite& a, StreamHandle stream) {
  if (a.rope < 0 || a.rope % 2 != 0 || a.rope > 64 * kRopeMaxPairsPerLane)
    return invalid_argument("cuda::mla_rope_cache_write: rope width must be even and in [0, 128], got " +
                            std::to_string(a.rope));
  if (a.heads < 0 || a.heads > 65534 || a.latent <= 0 || a.nope < 0)
    return invalid_argument("cuda::mla_rope_cache_write: need 0 ≤ heads < 65535, latent > 0, nope ≥ 0");
  if (a.heads > 0 && (!a.q || !a.q_bf || !a.q_abs))
    return invalid_argument("cuda::mla_rope_cache_write: query heads need q, q_bf and q_abs");
  if (a.ckv_stride != 0 && a.ckv_stride < a.latent + a.rope)
    return invalid_argument("cuda::mla_rope_cache_write: ckv_stride must be 0 or ≥ latent + rope");
  if (a.n == 0) return ok_status();
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(a.heads + 1));
  return check_cuda(launch_pdl(mla_rope_cache_write_kernel, grid, dim3(kMlaCacheRowThreads), 0, stream, a),
                    "cuda::mla_rope_cache_write");
}

}  // namespace kiln::cuda
