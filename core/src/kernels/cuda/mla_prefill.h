// Causal MLA prefill attention in the expanded (non-absorbed) form, varlen over a batch of sequences.
//
// Per head h, query row i of sequence b sits at position kv_len − q_len + i and attends to keys 0 .. that position
// of the same sequence: score = scale · (q_nope·k_nope[key, h] + q_rope·k_rope[key]), out = softmax · v[key, h].
// k_rope is MLA's decoupled rope key, one row per key shared by every head. q comes in bf16 (the roped query as the
// absorbed path rounds it too: half the bytes of fp32, read once per CTA before its first product); scores and the
// softmax are fp32, the softmax weights rounded to bf16 before the value product (both on the tensor cores, fp32
// accumulation).
//
// (nope, rope, v) = (192, 64, 256) (GLM-4.7-Flash) and (128, 64, 128) (DeepSeek-V3) run a tensor-core kernel:
// 128 query rows × one head per CTA, 64-key tiles streamed once through shared memory, online softmax in
// registers. On compute capability 9.0 with total_keys given that is the Hopper form (mla_prefill_sm90.h:
// TMA producer, two wgmma consumer warpgroups, the value product overlapped with the next tile's softmax); elsewhere
// a FlashAttention-2 style mma.sync kernel (cp.async: the next tile's K / this tile's V load while the tensor cores
// work). Any other dims (or strides / pointers not 16-byte aligned) take a plain fp32 CUDA-core kernel.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// One sequence of the batch, as the kernel reads it (a device array of these).
struct MlaPrefillSeq {
  int32_t q_row = 0;      // its first query row in q / out; its rows are q_row .. q_row + q_len − 1
  int32_t q_len = 0;      // new rows, at positions kv_len − q_len .. kv_len − 1 (q_len ≤ kv_len)
  int32_t key_start = 0;  // its key 0 in k_nope / k_rope / v; its keys are key_start .. key_start + kv_len − 1
  int32_t kv_len = 0;
};

// All strides in elements. Heads are the second index of q / k_nope / v / out.
struct MlaPrefillParams {
  const uint16_t* q = nullptr;  // [rows, H, nope + rope] bf16 (head stride nope + rope)
  int64_t q_row_stride = 0;
  const uint16_t* k_nope = nullptr;  // bf16, key `k`, head h at k_nope[k·k_nope_key_stride + h·k_nope_head_stride]
  int64_t k_nope_key_stride = 0, k_nope_head_stride = 0;
  const uint16_t* k_rope = nullptr;  // bf16 [keys, rope] at k_rope[k·k_rope_key_stride], shared by all heads
  int64_t k_rope_key_stride = 0;
  const uint16_t* v = nullptr;  // bf16, at v[k·v_key_stride + h·v_head_stride]
  int64_t v_key_stride = 0, v_head_stride = 0;
  uint16_t* out = nullptr;  // [rows, H, v] bf16 (head stride v); only the batch's rows are written
  int64_t out_row_stride = 0;
  const MlaPrefillSeq* seqs = nullptr;  // device [num_seqs]
  // Keys k_nope / k_rope / v hold (≥ every key_start + kv_len); all rows below it must be finite (the Hopper kernel
  // reads whole 64-key tiles, past a sequence's end into the next one's keys). 0: not given (no Hopper kernel).
  int64_t total_keys = 0;
  int64_t num_seqs = 0;
  int64_t max_q_len = 0;  // ≥ every q_len (sizes the grid)
  int64_t num_heads = 0, nope_dim = 0, rope_dim = 0, v_dim = 0;
  float scale = 1.0f;  // softmax scale (YaRN mscale included)
  bool use_wgmma = true;  // false: the mma.sync kernel even where the Hopper one applies (tests, benchmarks)
  // Block order. true: every head's last (longest) query tile first, heads the fastest index — the short tiles fill
  // the tail (at 4K keys the head-major order ran the last head's long tiles at the end: the kernel took 12 % longer
  // on an H100). false: head-major — a head's tiles run side by side and share its K / V in L2 (at 8K-32K keys 3 %
  // faster than heads first). The results do not depend on it.
  bool heads_fastest = true;
  // > 0: heads in groups of this many, one group after another, each group's blocks longest query tile first and
  // its heads fastest (overrides heads_fastest): the blocks on the GPU at once read a few heads' K / V (sharing it
  // in L2, as head-major) while each group's short tiles still fill in behind its long ones (as heads first).
  int64_t head_group = 0;
};

// Whether (nope, rope, v) has a tensor-core kernel (otherwise the generic one runs).
bool mla_prefill_has_fast_path(int64_t nope_dim, int64_t rope_dim, int64_t v_dim);

Status mla_prefill_bf16(const MlaPrefillParams& params, StreamHandle stream);

}  // namespace kiln::cuda
