// The device half of `fp8_ds_mla`: checks what the core passes and launches the plugin's kernels on the core's
// stream. It fuses nothing into append() (append_fusions() = 0): the core normalises and ropes the rows and
// finishes the queries before it, so the layout sees final fp32 rows. Attention needs no workspace, so the
// default plan_attend() (one split, no workspace) is the plan.
#include <cstddef>
#include <string>

#include "fp8_mla_kernels.h"
#include "fp8_mla_layout.h"
#include "fp8_mla_row.h"

namespace kiln::fp8mla {
namespace {

static_assert(sizeof(GatherSeq) == sizeof(KvGatherSeq) && offsetof(GatherSeq, table_row) == offsetof(KvGatherSeq, table_row) &&
                  offsetof(GatherSeq, key_start) == offsetof(KvGatherSeq, key_start) &&
                  offsetof(GatherSeq, kv_len) == offsetof(KvGatherSeq, kv_len),
              "the gather kernel reads kiln::KvGatherSeq as GatherSeq");

Status launched(const char* error, const char* what) {
  if (error == nullptr) return ok_status();
  return internal_error(std::string("kv layout `fp8_ds_mla` ") + what + ": " + error);
}

class Fp8MlaCudaLayout final : public KvLayout {
 public:
  Fp8MlaCudaLayout(const KvGeometry& g, Device device) : g_(g), device_(device) {
    const RowGeometry row{g.latent_dim, g.rope_dim};
    shape_.latent = row.latent, shape_.rope = row.rope, shape_.tiles = row.tiles();
    shape_.scales_offset = row.scales_offset(), shape_.rope_offset = row.rope_offset(), shape_.row_bytes = row.bytes();
  }

  KvGeometry geometry() const override { return g_; }
  size_t bytes_per_token() const override { return static_cast<size_t>(shape_.row_bytes); }
  Device device() const override { return device_; }

  Status append(const KvAppendArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_stream(stream));
    if (a.norm_weight != nullptr || a.q != nullptr)
      return invalid_argument("kv layout `fp8_ds_mla` stores final rows; it fuses no prologue");
    if (a.n > 0 && (a.pages == nullptr || a.slots == nullptr || a.rows == nullptr))
      return invalid_argument("kv layout `fp8_ds_mla` append: null pages, slots or rows");
    return launched(launch_append(shape_, a.rows, a.row_stride > 0 ? a.row_stride : g_.latent_dim + g_.rope_dim,
                                  a.slots, a.n, static_cast<uint8_t*>(a.pages), stream.handle),
                    "append");
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
    p.scale = a.scale, p.out = a.out, p.out_bf16 = a.out_bf16;
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
};

}  // namespace

std::unique_ptr<KvLayout> make_cuda_layout(const KvGeometry& g, Device device) {
  return std::make_unique<Fp8MlaCudaLayout>(g, device);
}

}  // namespace kiln::fp8mla
