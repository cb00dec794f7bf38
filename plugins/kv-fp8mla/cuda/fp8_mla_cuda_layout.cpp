// The device half of `fp8_ds_mla`: checks what the core passes and launches the plugin's kernels on the core's
// stream. append() takes the MLA prologue (append_fusions(): the rows' norm and RoPE and the queries' finish, one
// launch with the quantization — fp8_mla_fused_append.cu) for latent ≤ 1,024; rows the core hands final (no norm
// weight, no positions, no queries) are quantized alone. KILN_FP8MLA_APPEND=separate declares no fusion (the core
// then runs its prologue kernel first, the A/B switch; the bytes are the same). Attention: for the published shapes (latent
// 512) the SDK's tensor-core MLA decode over fp8 tiles widened in shared memory, planned exactly as the bf16
// layout's; for other shapes the split-KV CUDA-core kernel when the plan's workspace comes with the call (the runners
// carve it from plan_attend), else the plain kernel (no workspace).
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fp8_mla_kernels.h"
#include "fp8_mla_layout.h"
#include "fp8_mla_row.h"
#include "kiln/cuda/mla_decode_plan.h"
#include "kiln/cuda/mla_decode_sync.h"

namespace kiln::fp8mla {
namespace {

static_assert(sizeof(GatherSeq) == sizeof(KvGatherSeq) && offsetof(GatherSeq, table_row) == offsetof(KvGatherSeq, table_row) &&
                  offsetof(GatherSeq, key_start) == offsetof(KvGatherSeq, key_start) &&
                  offsetof(GatherSeq, kv_len) == offsetof(KvGatherSeq, kv_len),
              "the gather kernel reads kiln::KvGatherSeq as GatherSeq");

constexpr size_t kMaxWorkspace = size_t{256} << 20;  // the split kernel's partial sums at most

Status launched(const char* error, const char* what) {
  if (error == nullptr) return ok_status();
  return internal_error(std::string("kv layout `fp8_ds_mla` ") + what + ": " + error);
}

class Fp8MlaCudaLayout final : public KvLayout {
 public:
  Fp8MlaCudaLayout(const KvGeometry& g, Device device) : g_(g), device_(device), sync_(device.index) {
    const RowGeometry row{g.latent_dim, g.rope_dim};
    shape_.latent = row.latent, shape_.rope = row.rope, shape_.tiles = row.tiles();
    shape_.scales_offset = row.scales_offset(), shape_.rope_offset = row.rope_offset(), shape_.row_bytes = row.bytes();
    const char* env = std::getenv("KILN_FP8MLA_APPEND");
    fuses_ = fused_append_supported(shape_) && !(env && std::strcmp(env, "separate") == 0);
  }

  KvGeometry geometry() const override { return g_; }
  size_t bytes_per_token() const override { return static_cast<size_t>(shape_.row_bytes); }
  Device device() const override { return device_; }
  IndexerKeyFormat indexer_key_format() const override { return IndexerKeyFormat::kFp8E4m3Scaled; }

  uint32_t append_fusions() const override {
    return fuses_ ? kKvFuseNormRope | kKvFuseQueries | kKvFuseQueriesBf16Only : 0u;
  }

  Status append(const KvAppendArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_stream(stream));
    if (a.n > 0 && (a.pages == nullptr || a.slots == nullptr || a.rows == nullptr))
      return invalid_argument("kv layout `fp8_ds_mla` append: null pages, slots or rows");
    const int64_t stride = a.row_stride > 0 ? a.row_stride : g_.latent_dim + g_.rope_dim;
    const bool prologue = a.norm_weight != nullptr || a.positions != nullptr || a.q != nullptr;
    if (!prologue)
      return launched(launch_append(shape_, a.rows, stride, a.slots, a.n, static_cast<uint8_t*>(a.pages),
                                    stream.handle),
                      "append");
    if (!fuses_)
      return invalid_argument("kv layout `fp8_ds_mla` declares no append fusion here (" +
                              std::string(fused_append_supported(shape_) ? "KILN_FP8MLA_APPEND=separate"
                                                                         : "latent above 1,024") +
                              "): it stores final rows only");
    if (a.positions != nullptr && a.inv_freq == nullptr)
      return invalid_argument("kv layout `fp8_ds_mla` append: positions without inv_freq");
    // q_abs null: the queries in bf16 only (kKvFuseQueriesBf16Only).
    if (a.q != nullptr && (a.heads <= 0 || a.q_bf == nullptr))
      return invalid_argument("kv layout `fp8_ds_mla` append: queries need heads > 0 and q_bf");
    FusedAppend f;
    f.rows = a.rows, f.row_stride = stride, f.n = a.n, f.slots = a.slots;
    f.norm_weight = a.norm_weight, f.eps = a.eps;
    f.positions = a.positions, f.inv_freq = a.inv_freq, f.rope_factor = a.rope_factor;
    f.q = a.q, f.heads = a.q ? a.heads : 0, f.nope = a.nope, f.q_bf = a.q_bf, f.q_abs = a.q_abs;
    return launched(launch_fused_append(shape_, f, static_cast<uint8_t*>(a.pages), stream.handle), "append");
  }

  // The split kernel's workspace depends on the shape only (rows, heads), never on lengths, so graphs stay valid.
  // 64 splits a row where they fit kMaxWorkspace (decode and verification batches), and always when the rows must
  // be batch-invariant (a row's splits then depend on its own length only); big prompt chunks take fewer.
  MlaAttendPlan plan_attend(const MlaAttendShape& shape) const override {
    MlaAttendPlan plan;
    if (tc_attend_supported(shape_, shape.selected_width)) {
      // As the bf16 layout: under batch invariance each row is split by its own length, the grid rounded up to 16
      // splits (a growing context re-captures the step's graph every 1,024 keys, not every 64).
      const int64_t keys = shape.selected_width > 0 ? shape.selected_width : shape.max_kv_len;
      plan.split_by_length = shape.batch_invariant;
      plan.num_splits = plan.split_by_length ? (cuda::mla_decode_length_splits(keys) + 15) / 16 * 16
                                             : cuda::mla_decode_num_splits(shape.num_queries, shape.num_heads, keys,
                                                                          std::max(1, shape.multiprocessor_count));
      plan.workspace_bytes =
          plan.num_splits > 1 ? cuda::mla_decode_workspace_bytes(shape.num_queries, shape.num_heads, plan.num_splits) : 0;
      return plan;
    }
    if (!split_attend_supported(shape_, shape.selected_width) || shape.num_queries <= 0 || shape.num_heads <= 0)
      return plan;
    const size_t per_slot = split_attend_workspace(shape.num_queries, shape.num_heads, g_.latent_dim, 1);
    int64_t slots = kSplitSlots;
    if (!shape.batch_invariant)
      slots = std::clamp<int64_t>(static_cast<int64_t>(kMaxWorkspace / per_slot), 1, kSplitSlots);
    plan.num_splits = static_cast<int>(slots);
    plan.workspace_bytes = per_slot * static_cast<size_t>(slots);
    return plan;
  }

  Status attend(const MlaAttendArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_stream(stream));
    if (a.num_queries > 0 && (a.cache == nullptr || a.q == nullptr || a.block_tables == nullptr ||
                              a.query_seq == nullptr || a.kv_len == nullptr || (!a.out && !a.out_bf16)))
      return invalid_argument(
          "kv layout `fp8_ds_mla` attend: cache, q, block_tables, query_seq, kv_len and out or out_bf16 are required");
    AttendParams p;
    p.shape = shape_;
    p.pages = static_cast<const uint8_t*>(a.cache), p.block_size = g_.block_size;
    p.q = a.q, p.num_queries = a.num_queries, p.num_heads = a.num_heads;
    p.block_tables = a.block_tables, p.max_blocks = a.max_blocks, p.query_seq = a.query_seq, p.kv_len = a.kv_len;
    p.selected = a.selected, p.selected_width = a.selected ? a.selected_width : 0;
    p.scale = a.scale, p.out = a.out, p.out_bf16 = a.out_bf16, p.out_lse = a.out_lse, p.sync = sync_.get();
    if (tc_attend_supported(shape_, p.selected_width)) {
      // Without the plan's workspace the rows are not split (correct, slower).
      const bool planned = a.num_splits > 1 && a.workspace != nullptr &&
                           a.workspace_bytes >= cuda::mla_decode_workspace_bytes(a.num_queries, a.num_heads, a.num_splits);
      return launched(launch_tc_attend(p, planned ? a.num_splits : 1, planned && a.split_by_length,
                                       planned ? a.workspace : nullptr, stream.handle),
                      "attend");
    }
    p.split_slots = a.num_splits;
    const bool split = a.workspace != nullptr && a.num_splits >= 1 && a.num_splits <= kSplitSlots &&
                       a.workspace_bytes >= split_attend_workspace(a.num_queries, a.num_heads, g_.latent_dim,
                                                                   a.num_splits) &&
                       split_attend_supported(shape_, p.selected_width);
    if (split) return launched(launch_split_attend(p, a.workspace, stream.handle), "attend");
    return launched(launch_attend(p, stream.handle), "attend");
  }

  // On CUDA, gather() returns bf16 rows (the SDK's contract): the dequantized values rounded to bf16.
  Status gather(const KvGatherArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_stream(stream));
    if (a.num_seqs > 0 && (a.pages == nullptr || a.block_tables == nullptr || a.seqs == nullptr || a.out == nullptr))
      return invalid_argument("kv layout `fp8_ds_mla` gather: null pages, tables, seqs or out");
    return launched(launch_gather(shape_, static_cast<const uint8_t*>(a.pages), g_.block_size, a.block_tables,
                                  a.max_blocks, reinterpret_cast<const GatherSeq*>(a.seqs), a.num_seqs, a.max_kv_len,
                                  static_cast<uint16_t*>(a.out), stream.handle),
                    "gather");
  }

 private:
  Status check_stream(Stream stream) const {
    if (stream.device != device_)
      return invalid_argument("kv layout `fp8_ds_mla` on " + device_.to_string() + " called with a stream on " +
                              stream.device.to_string());
    return ok_status();
  }

  KvGeometry g_;
  Device device_;
  RowShape shape_;
  bool fuses_ = false;        // append() takes the MLA prologue (fused_append_supported, not switched off)
  cuda::MlaDecodeSync sync_;  // the tensor-core attention's merge counters (one stream uses a layout at a time)
};

}  // namespace

std::unique_ptr<KvLayout> make_cuda_layout(const KvGeometry& g, Device device) {
  return std::make_unique<Fp8MlaCudaLayout>(g, device);
}

}  // namespace kiln::fp8mla
