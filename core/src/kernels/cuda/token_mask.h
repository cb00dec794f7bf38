// Constrained decoding on the device: the grammar's allowed-token bitmask applied to rows of a step's logits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/status.h"

namespace kiln::cuda {

// For each i < num_rows: logits[rows[i] · vocab + v] = −inf wherever bit v % 32 of masks[i · words + v / 32] is
// clear (words = ⌈vocab / 32⌉). Token selection then never picks, samples or accepts a disallowed token, exactly as
// the host's masked selection.
Status mask_disallowed_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* masks,
                              int64_t num_rows, cudaStream_t stream);

}  // namespace kiln::cuda
