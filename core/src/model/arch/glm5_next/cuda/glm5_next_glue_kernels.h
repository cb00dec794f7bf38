// The small kernels glm5_next's CUDA runner needs between the tested blocks of kernels/cuda: the hyper-connected
// residual streams in and out (broadcast of the embedding, mean at the end), and the pooled indexer's pool-key
// bookkeeping over the paged cache (a step's complete pools' keys gathered per sequence, new keys scattered).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::glm5_next::cuda {

using kiln::cuda::StreamHandle;

// x[t, s, :] = float(e[t, :]) for every stream s: e bf16 [n, dim], x fp32 [n, streams, dim].
Status hc_broadcast(const uint16_t* e, int64_t n, int64_t streams, int64_t dim, float* x, StreamHandle stream);

// The same from fp32 rows (a next-n layer's eh_proj output).
Status hc_broadcast_f32(const float* e, int64_t n, int64_t streams, int64_t dim, float* x, StreamHandle stream);

// out[t, :] = bf16(mean_s x[t, s, :]) (summed in stream order in fp32, as the CPU model).
Status hc_mean_bf16(const float* x, int64_t n, int64_t streams, int64_t dim, uint16_t* out, StreamHandle stream);
// The same in fp32 (a next-n layer's output hidden state).
Status hc_mean_f32(const float* x, int64_t n, int64_t streams, int64_t dim, float* out, StreamHandle stream);

// The pool keys of sequence s's first num_pools[s] pools into out rows pool_offset[s] .. + num_pools[s] (dim = 128
// floats each). Pool p's key lives in `keys` row slot(p · pool) / pool, where slot(t) = table[t / block_size] ·
// block_size + t % block_size (block_size a multiple of pool, so a pool's tokens share a block and the row is
// unique). tables [seqs, max_blocks]; grid-strided over max_pools.
Status gather_pool_keys(const float* keys, const int32_t* tables, int64_t max_blocks, int64_t block_size, int64_t pool,
                        const int32_t* num_pools, const int32_t* pool_offset, int64_t seqs, int64_t max_pools,
                        float* out, StreamHandle stream);

// keys[dst[i], :] = src[i, :] for i < n where dst[i] ≥ 0 (dim floats a row).
Status scatter_rows_skip(const float* src, const int32_t* dst, int64_t n, int64_t dim, float* keys,
                         StreamHandle stream);

}  // namespace kiln::glm5_next::cuda
