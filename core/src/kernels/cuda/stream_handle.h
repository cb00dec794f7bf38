// The stream type every CUDA launch wrapper takes. CUstream_st* is what cudaStream_t names, so callers can pass
// a cudaStream_t (or a kiln::Stream's handle cast to it) without this header pulling in the CUDA headers.
#pragma once

struct CUstream_st;

namespace kiln::cuda {
using StreamHandle = CUstream_st*;
}  // namespace kiln::cuda
