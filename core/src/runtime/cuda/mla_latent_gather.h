// Gathers sequences' cached MLA rows out of the paged bf16 cache into one contiguous array (the prefill path
// expands K_nope / V from them with a single GEMM).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/kv_layout.h"
#include "kiln/status.h"

namespace kiln::cuda {

// For sequence b and position t < seqs[b].kv_len: out[seqs[b].key_start + t, :] = pages[slot, :] with
// slot = block_tables[seqs[b].table_row, t / block_size] · block_size + t % block_size; rows are row_width bf16
// values. seqs and block_tables are device arrays; max_kv_len ≥ every kv_len.
struct MlaLatentGather {
  const uint16_t* pages = nullptr;
  int64_t block_size = 0;
  int64_t row_width = 0;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks = 0;
  const KvGatherSeq* seqs = nullptr;
  int64_t num_seqs = 0;
  int64_t max_kv_len = 0;
  uint16_t* out = nullptr;
};
Status mla_gather_latent_rows(const MlaLatentGather& g, StreamHandle stream);

}  // namespace kiln::cuda
