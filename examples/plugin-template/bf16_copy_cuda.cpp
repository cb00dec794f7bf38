// The device half of `bf16-copy`: checks the arguments the core passes and launches the plugin's kernels on the
// core's stream. It fuses nothing into append() (append_fusions() = 0): the core normalises and ropes the rows and
// finishes the queries before it, so the layout sees final fp32 rows. Attention needs no workspace, so the
// default plan_attend() (one split, no workspace) is the plan.
#include <cstddef>
#include <string>

#include "bf16_copy_kernels.h"
#include "bf16_copy_layout.h"

namespace example_plugin {
namespace {

static_assert(sizeof(GatherSeq) == sizeof(kiln::KvGatherSeq) &&
                  offsetof(GatherSeq, table_row) == offsetof(kiln::KvGatherSeq, table_row) &&
                  offsetof(GatherSeq, key_start) == offsetof(kiln::KvGatherSeq, key_start) &&
                  offsetof(GatherSeq, kv_len) == offsetof(kiln::KvGatherSeq, kv_len),
              "the gather kernel reads kiln::KvGatherSeq as GatherSeq");

kiln::Status launched(const char* error, const char* what) {
  if (error == nullptr) return kiln::ok_status();
  return kiln::internal_error(std::string("kv layout `bf16-copy` ") + what + ": " + error);
}

class Bf16CopyCuda final : public kiln::KvLayout {
 public:
  Bf16CopyCuda(const kiln::KvGeometry& g, kiln::Device device)
      : g_(g), device_(device), width_(g.latent_dim + g.rope_dim) {}

  kiln::KvGeometry geometry() const override { return g_; }
  size_t bytes_per_token() const override { return static_cast<size_t>(width_) * sizeof(uint16_t); }
  kiln::Device device() const override { return device_; }

  kiln::Status append(const kiln::KvAppendArgs& a, kiln::Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_stream(stream));
    if (a.norm_weight != nullptr || a.q != nullptr)
      return kiln::invalid_argument("kv layout `bf16-copy` stores final rows; it fuses no prologue");
    if (a.n > 0 && (a.pages == nullptr || a.slots == nullptr || a.rows == nullptr))
      return kiln::invalid_argument("kv layout `bf16-copy` append: null pages, slots or rows");
    return launched(launch_append(a.rows, a.row_stride > 0 ? a.row_stride : width_, a.slots, a.n, width_,
                                  static_cast<uint16_t*>(a.pages), stream.handle),
                    "append");
  }

  kiln::Status attend(const kiln::MlaAttendArgs& a, kiln::Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_stream(stream));
    if (a.num_queries > 0 && (a.cache == nullptr || a.q == nullptr || a.block_tables == nullptr ||
                              a.query_seq == nullptr || a.kv_len == nullptr || (!a.out && !a.out_bf16)))
      return kiln::invalid_argument(
          "kv layout `bf16-copy` attend: cache, q, block_tables, query_seq, kv_len and out or out_bf16 are required");
    AttendParams p;
    p.pages = static_cast<const uint16_t*>(a.cache);
    p.latent_dim = g_.latent_dim, p.rope_dim = g_.rope_dim, p.block_size = g_.block_size;
    p.q = a.q, p.num_queries = a.num_queries, p.num_heads = a.num_heads;
    p.block_tables = a.block_tables, p.max_blocks = a.max_blocks, p.query_seq = a.query_seq, p.kv_len = a.kv_len;
    p.selected = a.selected, p.selected_width = a.selected ? a.selected_width : 0;
    p.scale = a.scale, p.out = a.out, p.out_bf16 = a.out_bf16;
    return launched(launch_attend(p, stream.handle), "attend");
  }

  // On CUDA, gather() returns bf16 rows (the SDK's contract): the stored values as they are.
  kiln::Status gather(const kiln::KvGatherArgs& a, kiln::Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_stream(stream));
    if (a.num_seqs > 0 && (a.pages == nullptr || a.block_tables == nullptr || a.seqs == nullptr || a.out == nullptr))
      return kiln::invalid_argument("kv layout `bf16-copy` gather: null pages, tables, seqs or out");
    return launched(launch_gather(static_cast<const uint16_t*>(a.pages), g_.block_size, width_, a.block_tables,
                                  a.max_blocks, reinterpret_cast<const GatherSeq*>(a.seqs), a.num_seqs, a.max_kv_len,
                                  static_cast<uint16_t*>(a.out), stream.handle),
                    "gather");
  }

 private:
  kiln::Status check_stream(kiln::Stream stream) const {
    if (stream.device != device_)
      return kiln::invalid_argument("kv layout `bf16-copy` on " + device_.to_string() + " called with a stream on " +
                                    stream.device.to_string());
    return kiln::ok_status();
  }

  kiln::KvGeometry g_;
  kiln::Device device_;
  int64_t width_;
};

}  // namespace

std::unique_ptr<kiln::KvLayout> make_bf16_copy_cuda(const kiln::KvGeometry& g, kiln::Device device) {
  return std::make_unique<Bf16CopyCuda>(g, device);
}

}  // namespace example_plugin
