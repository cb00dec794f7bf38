// Embedding lookup on the GPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// out[t, :] = table[ids[t], :] for n ids; table bf16 [vocab, dim], out bf16 [n, dim]. An id outside
// [0, vocab) yields a zero row (the caller validates token ids; this keeps a bad id from reading out of bounds).
Status embedding_gather_bf16(const uint16_t* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                             uint16_t* out, StreamHandle stream);

}  // namespace kiln::cuda
