#include "runtime/cuda/split_context_merge.h"

#include <climits>
#include <cmath>

#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128;

// Block t · head_count + j: head j of the kept ones, row t. The parts are few (the ranks of a group), so every thread works the
// weights out itself rather than sharing them.
__global__ void merge_attention_parts_kernel(const float* __restrict__ parts, const float* __restrict__ lses,
                                             int num_parts, int64_t rows, int64_t heads, int64_t latent,
                                             int64_t head_begin, int64_t head_count, uint16_t* __restrict__ out) {
  const int64_t j = blockIdx.x % head_count, t = blockIdx.x / head_count, qh = t * heads + head_begin + j;
  float m = -INFINITY;
  for (int p = 0; p < num_parts; ++p) m = fmaxf(m, lses[p * rows + qh]);
  float total = 0.0f;
  for (int p = 0; p < num_parts; ++p) {
    const float lse = lses[p * rows + qh];
    total += lse == -INFINITY ? 0.0f : expf(lse - m);
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  uint16_t* o = out + (t * head_count + j) * latent;
  for (int64_t d = threadIdx.x; d < latent; d += kThreads) {
    float v = 0.0f;
    for (int p = 0; p < num_parts; ++p) {
      const float lse = lses[p * rows + qh];
      if (lse != -INFINITY) v += expf(lse - m) * parts[(p * rows + qh) * latent + d];
    }
    o[d] = float_to_bf16_bits(v * inv);
  }
}

}  // namespace

Status merge_attention_parts_bf16(const float* parts, const float* lses, int64_t num_parts, int64_t n, int64_t heads,
                                  int64_t latent, int64_t head_begin, int64_t head_count, uint16_t* out,
                                  StreamHandle stream) {
  if (num_parts < 1 || num_parts > 1024 || heads < 1 || latent < 1 || head_begin < 0 || head_count < 0 ||
      head_begin + head_count > heads || n < 0 || n * head_count > INT32_MAX)
    return invalid_argument("cuda::merge_attention_parts_bf16: bad shape");
  if (n == 0 || head_count == 0) return ok_status();
  merge_attention_parts_kernel<<<static_cast<unsigned>(n * head_count), kThreads, 0, stream>>>(
      parts, lses, static_cast<int>(num_parts), n * heads, heads, latent, head_begin, head_count, out);
  return check_launch("merge_attention_parts_bf16");
}

}  // namespace kiln::cuda
