// The DSA indexer's fp8 key rows on CUDA (IndexerKeyFormat::kFp8E4m3Scaled, kiln/indexer_key_format.h): the append
// that quantizes this step's keys into the cache, byte for byte as the host codec (kiln/indexer_key_codec.h), and
// the scores over such rows (reached through dsa_indexer_scores_paged with key_format set).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {

// For t < n with slots[t] ≥ 0: the row at cache + slots[t] · (dim + 4) = encode_indexer_key_fp8(k[t, :]): dim e4m3
// codes of k / scale (the hardware's satfinite conversion, to nearest even, after an IEEE division) and the fp32
// scale max(amax / 448, FLT_MIN). A negative slot stores nothing. dim a multiple of 4 (the scale stays 4-byte
// aligned; the cache itself is at least 4-byte aligned).
Status indexer_keys_append_fp8(const float* k, int64_t n, int64_t dim, const int64_t* slots, uint8_t* cache,
                               StreamHandle stream);

// dsa_indexer_scores_paged over fp8 rows (p.key_format == kFp8E4m3Scaled, p.keys the rows [slots, dim + 4]).
Status dsa_indexer_scores_paged_fp8(const DsaIndexerParams& p, StreamHandle stream);

}  // namespace kiln::cuda
