// MLA attention for the sequences that bring more than one new token in a step (prefill / chunked prefill), in
// the expanded form: each sequence's cached latent rows are gathered from its pages by the KV layout (bf16 rows,
// whatever the layout stores), K_nope and V are expanded from them head by head against kv_b_proj (each head's
// values independent of how many heads the call has: tensor-parallel ranks expand only theirs), and the
// causal tensor-core kernel of kernels/cuda/mla_prefill.h runs over the result. Per (query, key) pair and head this costs nope + rope + v
// multiply-adds, against 2 · (latent + rope) in the absorbed decode form.
//
// The cache rows must already hold every position the rows attend to, the step's new tokens included (run
// mla_write_cache first). Not graph-capturable (it uploads the sequence table), and not meant to be: prefill
// steps are not graphed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "kernels/cuda/stream_handle.h"
#include "kiln/kv_layout.h"
#include "kiln/status.h"

struct cublasContext;

namespace kiln::cuda {

// One prefilling sequence, host side.
struct MlaPrefillSequence {
  int64_t q_row = 0;      // its first row in q / out (rows q_row .. q_row + q_len − 1)
  int64_t q_len = 0;      // new tokens this step, at positions kv_len − q_len .. kv_len − 1; 1 ≤ q_len ≤ kv_len
  int64_t kv_len = 0;     // start position + q_len: cache positions 0 .. kv_len − 1 are read
  int64_t table_row = 0;  // its row of block_tables
};

struct MlaPrefillDims {
  int64_t num_heads = 0;
  int64_t nope_dim = 0;    // qk_nope_head_dim
  int64_t rope_dim = 0;    // qk_rope_head_dim
  int64_t v_dim = 0;       // v_head_dim
  int64_t latent_dim = 0;  // kv_lora_rank
};

struct MlaPrefillArgs {
  std::span<const MlaPrefillSequence> seqs;
  MlaPrefillDims dims;
  const uint16_t* q = nullptr;  // device bf16 [rows, H, nope + rope], q_pe already roped
  const KvLayout* layout = nullptr;  // gathers this layer's rows
  const void* pages = nullptr;       // this layer's pages
  Stream stream;                     // the layout's stream (the same CUDA stream as the call's)
  int64_t block_size = 0;
  const int32_t* block_tables = nullptr;  // device [table rows, max_blocks]
  int64_t max_blocks = 0;
  const uint16_t* kv_b = nullptr;  // kv_b_proj.weight bf16 [H · (nope + v), latent] (per head: W_UK rows, then W_UV)
  float scale = 1.0f;              // softmax scale, YaRN mscale included
  uint16_t* out = nullptr;         // device bf16 [rows, H, v]; only the sequences' rows are written
  void* workspace = nullptr;       // device, mla_prefill_workspace_bytes(...) bytes
  size_t workspace_bytes = 0;
  // One long prompt in tiles, layer by layer (cuda_mla_moe_model.cpp's layer-major prefill): the workspace keeps what
  // the layer's earlier tiles gathered and expanded, so each cached key goes through kv_b once per layer, not once
  // per tile. key_capacity: the keys the workspace was laid out for (its heads' stride; ≥ Σ kv_len; 0: Σ kv_len).
  // keys_ready > 0 (one sequence, a multiple of block_size, below kv_len, no gather_rows): keys 0 .. keys_ready − 1
  // are in the workspace already, laid out for the same key_capacity; only keys_ready .. kv_len − 1 are gathered and
  // expanded.
  int64_t key_capacity = 0;
  int64_t keys_ready = 0;
  // Optional: writes the sequences' rows [Σ kv_len, latent + rope] (bf16, sequence after sequence in `seqs` order)
  // instead of the layout's gather over `pages` — decode-context parallelism, whose rows are spread over ranks.
  std::function<Status(uint16_t* latent)> gather_rows;
};

// Device scratch for a batch of `num_seqs` sequences whose kv_len sum to `total_keys`: the sequence tables, the
// gathered latent rows [total_keys, latent + rope] and the expanded K_nope / V [H, total_keys, nope + v] (bf16;
// at 128K keys of GLM-4.7-Flash that is 2.3 GB).
size_t mla_prefill_workspace_bytes(int64_t num_seqs, int64_t total_keys, const MlaPrefillDims& dims);

Status mla_prefill_attention(const MlaPrefillArgs& args, cublasContext* blas, StreamHandle stream);

}  // namespace kiln::cuda
