// Decode-context parallelism's merge on CUDA: the partial attention results of the ranks of a group, each over its
// own tokens, combined into what attention over all of them gives (flash-decoding's merge, across ranks).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// parts [num_parts][n · heads][latent] fp32 and their log-sum-exps lses [num_parts][n · heads] (−inf: a part saw no
// key; its values are not read) → out [n][head_count][latent] bf16 for heads head_begin .. head_begin + head_count:
// out = Σ_p e^{lse_p − M} · part_p / Σ_p e^{lse_p − M}, M the largest lse, summed in part order (every rank computes
// the same bits for a head); 0 where no part saw a key.
Status merge_attention_parts_bf16(const float* parts, const float* lses, int64_t num_parts, int64_t n, int64_t heads,
                                  int64_t latent, int64_t head_begin, int64_t head_count, uint16_t* out,
                                  StreamHandle stream);

}  // namespace kiln::cuda
