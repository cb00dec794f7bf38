#include "kernels/cuda/token_mask.h"

#include <cmath>
#include <string>

namespace kiln::cuda {
namespace {

// One thread per 32-token word of a row; blockIdx.y picks the row. Allowed words (the common case inside a string or
// a number's digits: nearly every bit set, or nearly none) are skipped with one load.
__global__ void mask_logits_kernel(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* masks,
                                   int64_t words) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= words) return;
  const int64_t i = blockIdx.y;
  uint32_t bits = masks[i * words + w];
  if (bits == 0xFFFFFFFFu) return;
  float* row = logits + static_cast<int64_t>(rows[i]) * vocab;
  const int64_t first = w * 32;
  for (int b = 0; b < 32 && first + b < vocab; ++b)
    if (!((bits >> b) & 1u)) row[first + b] = -INFINITY;
}

}  // namespace

Status mask_disallowed_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* masks,
                              int64_t num_rows, cudaStream_t stream) {
  if (num_rows == 0) return ok_status();
  if (!logits || !rows || !masks || vocab <= 0 || num_rows > 65535)
    return invalid_argument("token masks: need logits, rows, masks, a vocabulary and at most 65535 rows");
  const int64_t words = (vocab + 31) / 32;
  const dim3 grid(static_cast<unsigned>((words + 255) / 256), static_cast<unsigned>(num_rows));
  mask_logits_kernel<<<grid, 256, 0, stream>>>(logits, vocab, rows, masks, words);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return internal_error(std::string("token masks: ") + cudaGetErrorString(e));
  return ok_status();
}

}  // namespace kiln::cuda
