// Non-causal attention within one frame of the vision tower, flash style: the frame's q, k and v are first rounded to
// bf16 into a workspace, head by head; then each block keeps 64 or 128 queries' running softmax and output in
// registers and streams the head's keys and values through shared memory in double-buffered tiles of 64 (cp.async),
// so no score matrix is ever written (the cuBLAS path writes and rereads heads × len² floats per block of the tower).
// Products on the tensor cores in bf16 with fp32 accumulators (queries, keys, values and the probabilities rounded
// to bf16, as transformers' bf16 sdpa does); softmax statistics in fp32. The TF32 tower's attention; the fp32 tower
// (the tests' reference mode) keeps cuBLAS.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kiln::vision::cuda {

// Head widths the kernel is built for (multiples of 16 up to 128).
bool flash_attention_supported(int64_t head_dim);

// Device bytes flash_attention_frame needs as workspace for a frame of `len` rows.
size_t flash_attention_workspace_bytes(int64_t len, int64_t heads, int64_t head_dim);

// out[start + i, head·hd .. +hd) = softmax(q_i·Kᵀ·scale)·V over the frame's rows [start, start + len), for every
// head; qkv fp32 [n, 3, heads, hd] (row stride 3·heads·hd), out fp32 [n, heads·hd]; workspace (16-byte aligned) of
// flash_attention_workspace_bytes(len, heads, head_dim).
cudaError_t flash_attention_frame(const float* qkv, float* out, int64_t start, int64_t len, int64_t heads,
                                  int64_t head_dim, float scale, void* workspace, cudaStream_t stream);

}  // namespace kiln::vision::cuda
