#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/sampling.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 512;

struct Best {
  float v;
  int i;  // −1: none
};

struct BestOp {
  __device__ Best operator()(const Best& a, const Best& b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (a.v != b.v) return a.v > b.v ? a : b;
    return a.i < b.i ? a : b;
  }
};

template <class Temp>
__device__ Best row_argmax(const float* row, int64_t vocab, Temp& temp) {
  Best b{0.f, -1};
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (!isnan(v)) b = BestOp()(b, Best{v, static_cast<int>(i)});
  }
  return cub::BlockReduce<Best, kThreads>(temp).Reduce(b, BestOp());
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* __restrict__ logits, int64_t vocab,
                                                          int32_t* __restrict__ out) {
  __shared__ typename cub::BlockReduce<Best, kThreads>::TempStorage temp;
  const Best b = row_argmax(logits + blockIdx.x * vocab, vocab, temp);
  if (threadIdx.x == 0) out[blockIdx.x] = b.i < 0 ? 0 : b.i;
}

}  // namespace

Status argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, StreamHandle stream) {
  if (vocab <= 0 || vocab > INT32_MAX) return invalid_argument("cuda::argmax_rows: vocab out of range");
  if (rows <= 0) return ok_status();
  argmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, out);
  return check_launch("cuda::argmax_rows");
}

}  // namespace kiln::cuda
