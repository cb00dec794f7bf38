#include "kernels/cuda/embedding.h"
#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

// One block per token. kVector: the row is moved in 16-byte words (dim % 8 == 0 and 16-byte aligned pointers).
template <bool kVector>
__global__ void embedding_kernel(const uint16_t* __restrict__ table, int64_t vocab, int64_t dim,
                                 const int32_t* __restrict__ ids, uint16_t* __restrict__ out) {
  const int64_t t = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  if constexpr (kVector) {
    const uint4* src = reinterpret_cast<const uint4*>(table + static_cast<int64_t>(valid ? id : 0) * dim);
    uint4* dst = reinterpret_cast<uint4*>(out + t * dim);
    for (int64_t i = threadIdx.x; i < dim / 8; i += blockDim.x) dst[i] = valid ? src[i] : make_uint4(0, 0, 0, 0);
  } else {
    const uint16_t* src = table + static_cast<int64_t>(valid ? id : 0) * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[t * dim + i] = valid ? src[i] : uint16_t{0};
  }
}

}  // namespace

Status embedding_gather_bf16(const uint16_t* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                             uint16_t* out, StreamHandle stream) {
  if (n < 0 || dim <= 0 || vocab <= 0) return invalid_argument("cuda::embedding_gather_bf16: bad shape");
  if (n == 0) return ok_status();
  const bool vector = dim % 8 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
  return check_cuda(launch_pdl(vector ? embedding_kernel<true> : embedding_kernel<false>,
                                dim3(static_cast<unsigned>(n)), dim3(256), 0, stream, table, vocab, dim, ids, out),
                    "cuda::embedding_gather_bf16");
}

}  // namespace kiln::cuda
