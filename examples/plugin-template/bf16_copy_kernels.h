// The CUDA kernels of `bf16-copy` (bf16_copy_kernels.cu): raw device pointers and sizes in, launched on `stream`
// (a cudaStream_t). No CUDA or kiln header here, so the layout's C++ half compiles with the host compiler alone.
// Pages are bf16 [slots, width], width = latent_dim + rope_dim, slot = page · block_size + offset. Each launcher
// returns null once its kernel is queued, else what went wrong.
#pragma once

#include <cstdint>

namespace example_plugin {

// pages[slots[t], :] = bf16(rows[t, :]) for t < n (rows fp32, `row_stride` floats apart); a negative slot stores
// nothing.
const char* launch_append(const float* rows, int64_t row_stride, const int64_t* slots, int64_t n, int64_t width,
                          uint16_t* pages, void* stream);

// Absorbed MLA attention, one thread block per (query row, head): out[r, h, :] = Σ_t softmax_t(scale · q[r, h, :] ·
// row_t) · row_t[:latent_dim] over query r's visible positions t — those below kv_len[r], or with `selected` the
// listed ones below kv_len[r] (each once; −1 = padding) — through block_tables[query_seq[r]]. out (fp32) and
// out_bf16 are each optional. Every visible position must have a page.
struct AttendParams {
  const uint16_t* pages = nullptr;
  int64_t latent_dim = 0, rope_dim = 0, block_size = 0;
  const float* q = nullptr;  // [num_queries, num_heads, width]
  int64_t num_queries = 0, num_heads = 0;
  const int32_t* block_tables = nullptr;  // [rows, max_blocks]
  int64_t max_blocks = 0;
  const int32_t* query_seq = nullptr;  // [num_queries]
  const int32_t* kv_len = nullptr;     // [num_queries]
  const int32_t* selected = nullptr;   // [num_queries, selected_width] or null
  int64_t selected_width = 0;
  float scale = 1.0f;
  float* out = nullptr;          // [num_queries, num_heads, latent_dim]
  uint16_t* out_bf16 = nullptr;  // the same, rounded to nearest even
};
const char* launch_attend(const AttendParams& p, void* stream);

// kiln::KvGatherSeq as the kernel reads it (bf16_copy_cuda.cpp checks the two agree).
struct GatherSeq {
  int32_t table_row, key_start, kv_len, reserved;
};

// out[seq.key_start + t, :] = pages[slot of position t of table row seq.table_row, :] for t < seq.kv_len, for each
// of num_seqs sequences; max_kv_len ≥ every kv_len.
const char* launch_gather(const uint16_t* pages, int64_t block_size, int64_t width, const int32_t* block_tables,
                          int64_t max_blocks, const GatherSeq* seqs, int64_t num_seqs, int64_t max_kv_len,
                          uint16_t* out, void* stream);

}  // namespace example_plugin
