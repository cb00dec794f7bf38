// Argmax of a batch of logit rows on the GPU (semantics of kiln::cpu::argmax). Sampling and the verification of
// drafts are in kernels/cuda/token_select.h.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// out[r] = argmax of row r (lowest index among equal maxima, NaN never wins). logits fp32 [rows, vocab].
Status argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, StreamHandle stream);

}  // namespace kiln::cuda
