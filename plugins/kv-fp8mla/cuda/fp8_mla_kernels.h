// The CUDA kernels of `fp8_ds_mla` (fp8_mla_kernels.cu): raw device pointers and sizes in, launched on `stream` (a
// cudaStream_t). No CUDA or kiln header here, so the layout's C++ half compiles with the host compiler alone. Rows
// are fp8_mla_row.h's format, `row_bytes` apart; slot = page · block_size + offset. Each launcher returns null
// once its kernel is queued, else what went wrong.
#pragma once

#include <cstdint>

namespace kiln::fp8mla {

struct RowShape {
  int64_t latent = 0, rope = 0;
  int64_t tiles = 0, scales_offset = 0, rope_offset = 0, row_bytes = 0;
};

// Quantize on write: row t of `rows` (fp32, latent then rope, `row_stride` floats apart) into slot slots[t], as
// encode_row does on the host, bit for bit (amax per 128-value tile, scale = max(amax / 448, FLT_MIN), e4m3 of
// x / scale rounded to nearest even and saturated, bf16 rope). A negative slot stores nothing.
const char* launch_append(const RowShape& s, const float* rows, int64_t row_stride, const int64_t* slots, int64_t n,
                          uint8_t* pages, void* stream);

// The append with the MLA prologue fused (fp8_mla_fused_append.cu; the layout's append_fusions()): for n tokens,
// RoPE on the queries' rope parts in place with q_bf = bf16(q) and the absorbed tail q_abs[t, h, latent:], RoPE on
// each row's rope part in place, the latent's RMSNorm (norm_weight null: as given), then the row quantized as
// launch_append does — the same bytes as the core's prologue kernel followed by launch_append. positions null: no
// RoPE; heads 0: no queries. Takes latent ≤ 1,024 and rope even ≤ 256 (fused_append_supported).
struct FusedAppend {
  float* rows = nullptr;  // [n] rows of latent + rope fp32, row_stride floats apart (> 0)
  int64_t row_stride = 0, n = 0;
  const int64_t* slots = nullptr;
  const uint16_t* norm_weight = nullptr;  // bf16 [latent] or null
  float eps = 0.0f;
  const int64_t* positions = nullptr;     // [n] or null
  const float* inv_freq = nullptr;        // [rope / 2]
  float rope_factor = 1.0f;
  float* q = nullptr;                     // [n, heads, nope + rope] fp32
  int64_t heads = 0, nope = 0;
  uint16_t* q_bf = nullptr;               // [n, heads, nope + rope]
  float* q_abs = nullptr;                 // [n, heads, latent + rope]; null: q_bf alone (q left unroped)
};
bool fused_append_supported(const RowShape& s);
const char* launch_fused_append(const RowShape& s, const FusedAppend& a, uint8_t* pages, void* stream);

// Absorbed MLA attention over the fp8 pages, one thread block per (query row, head), exact two-pass softmax in
// fp32 on CUDA cores: out[r, h, :] = Σ_t softmax_t(scale · q[r, h, :] · row_t) · row_t[:latent] over query r's
// visible positions — those below kv_len[r], or with `selected` the listed ones below kv_len[r] (each once; −1 =
// padding) — each row dequantized as it is read (e4m3 · its tile's scale; the rope part widened).
struct AttendParams {
  RowShape shape;
  const uint8_t* pages = nullptr;
  int64_t block_size = 0;
  const float* q = nullptr;  // [num_queries, num_heads, latent + rope]
  int64_t num_queries = 0, num_heads = 0;
  const int32_t* block_tables = nullptr;  // [rows, max_blocks]
  int64_t max_blocks = 0;
  const int32_t* query_seq = nullptr;  // [num_queries]
  const int32_t* kv_len = nullptr;     // [num_queries]
  const int32_t* selected = nullptr;   // [num_queries, selected_width] or null
  int64_t selected_width = 0;
  float scale = 1.0f;
  float* out = nullptr;          // [num_queries, num_heads, latent], optional
  uint16_t* out_bf16 = nullptr;  // the same rounded to bf16, optional
  float* out_lse = nullptr;      // [num_queries, num_heads] log-sum-exp of the scaled scores (−inf: no key), optional
  int64_t split_slots = 0;       // launch_split_attend: splits a row may take (1..kSplitSlots)
  unsigned* sync = nullptr;      // launch_tc_attend: the layout's merge counters (kiln/cuda/mla_decode_sync.h), optional
};
const char* launch_attend(const AttendParams& p, void* stream);

// The split-KV form of the same attention: grid (query rows, kSplitSlots, head groups of 16); each block takes up
// to 16 heads of one row over one contiguous range of its candidates, so a row's keys are read once per head group
// rather than once per head, dequantized into shared memory tile by tile, with an online softmax; a second launch
// merges a row's splits in order. How a row is split depends on its own candidate count only (batch-invariant),
// and the grid and workspace only on the shape and `split_slots` (graph-safe). Returns null, or why not.
inline constexpr int64_t kSplitSlots = 64;
// Workspace bytes for `num_queries` rows of `num_heads` heads with latent `latent`, `slots` splits a row.
size_t split_attend_workspace(int64_t num_queries, int64_t num_heads, int64_t latent, int64_t slots);
// Whether the split form takes this shape (shared memory for its tiles and the selection list).
bool split_attend_supported(const RowShape& s, int64_t selected_width);
const char* launch_split_attend(const AttendParams& p, void* workspace, void* stream);

// The tensor-core form (fp8_mla_tc_attend.cu): the SDK's MLA decode attention (kiln/cuda/mla_decode_tc.cuh) over
// fp8 rows widened to bf16 in shared memory (q and the attention weights rounded to bf16 as well, fp32 sums), for
// latent 512 with rope 64 (dense) or 0 (dense or selected). Splits, split_by_length and workspace as planned by
// kiln/cuda/mla_decode_plan.h; num_splits > 1 needs mla_decode_workspace_bytes of workspace.
// Two forms run it (same plan, splits and merge): on sm_90+ for dense pages of 8, 16, 32 or a multiple of 64 slots,
// the direct form (fp8_mla_direct_attend.cu: whole pages bulk-copied, the e4m3 values multiplied as fp16 with q in
// fp16 and the scales applied to the score partials and the weights, no widening pass); otherwise, or with
// KILN_FP8MLA_ATTEND=widened, the widened one. kDirect where the direct form cannot run returns why.
enum class TcForm { kAuto, kWidened, kDirect };
bool tc_attend_supported(const RowShape& s, int64_t selected_width);
// Whether the direct form takes these pages on the current device (before the switch).
bool direct_attend_takes(const RowShape& s, int64_t block_size, int64_t selected_width, const void* pages);
const char* launch_tc_attend(const AttendParams& p, int num_splits, bool split_by_length, void* workspace,
                             void* stream, TcForm form = TcForm::kAuto);

// kiln::KvGatherSeq as the kernel reads it (the layout checks the two agree).
struct GatherSeq {
  int32_t table_row, key_start, kv_len, reserved;
};

// out[seq.key_start + t, :] = the dequantized row of position t (bf16, rounded to nearest even) for t < kv_len of
// each sequence; max_kv_len ≥ every kv_len.
const char* launch_gather(const RowShape& s, const uint8_t* pages, int64_t block_size, const int32_t* block_tables,
                          int64_t max_blocks, const GatherSeq* seqs, int64_t num_seqs, int64_t max_kv_len,
                          uint16_t* out, void* stream);

}  // namespace kiln::fp8mla
