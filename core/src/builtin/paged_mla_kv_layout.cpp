#include "builtin/paged_mla_kv_layout.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/half_float.h"
#include "kernels/cpu/mla_attention.h"

namespace kiln::builtin {
namespace {

// Storage element of a layout: how fp32 values are stored, widened back, and attended over.
struct Bf16Storage {
  using Element = uint16_t;
  static constexpr const char* kName = "bf16";
  static void store(const float* in, Element* out, int64_t n) { cpu::float_to_bf16(in, out, n); }
  static void load(const Element* in, float* out, int64_t n) { cpu::bf16_to_float(in, out, n); }
  static constexpr auto attend = cpu::mla_attention_absorbed_bf16;
};

struct F32Storage {
  using Element = float;
  static constexpr const char* kName = "fp32";
  static void store(const float* in, Element* out, int64_t n) { std::copy_n(in, n, out); }
  static void load(const Element* in, float* out, int64_t n) { std::copy_n(in, n, out); }
  static constexpr auto attend = cpu::mla_attention_absorbed_f32;
};

template <class Storage>
class PagedMlaKvLayout final : public KvLayout {
  using Element = typename Storage::Element;

 public:
  explicit PagedMlaKvLayout(KvGeometry g) : g_(g), row_(g.latent_dim + g.rope_dim) {}

  KvGeometry geometry() const override { return g_; }
  size_t bytes_per_token() const override { return static_cast<size_t>(row_) * sizeof(Element); }
  Device device() const override { return Device::cpu(); }

  // Final rows only (the CPU model normalises and ropes before appending). A negative slot marks a padding token.
  Status append(const KvAppendArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.norm_weight != nullptr || a.q != nullptr)
      return invalid_argument(std::string("kv layout `") + Storage::kName + "` (CPU) appends final rows; it fuses no prologue");
    if (a.pages == nullptr || (a.n > 0 && (a.slots == nullptr || a.rows == nullptr)))
      return invalid_argument(std::string("kv layout `") + Storage::kName + "` append: null pages, slots or rows");
    auto* pages = static_cast<Element*>(a.pages);
    const int64_t stride = a.row_stride > 0 ? a.row_stride : row_;
#pragma omp parallel for schedule(static) if (a.n * row_ >= (1 << 15))
    for (int64_t i = 0; i < a.n; ++i) {
      if (a.slots[i] < 0) continue;
      Storage::store(a.rows + i * stride, pages + a.slots[i] * row_, row_);
    }
    return ok_status();
  }

  Status gather(const KvGatherArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.num_seqs > 0 && (a.pages == nullptr || a.block_tables == nullptr || a.seqs == nullptr || a.out == nullptr))
      return invalid_argument(std::string("kv layout `") + Storage::kName + "` gather: null pages, tables, seqs or out");
    const auto* pages = static_cast<const Element*>(a.pages);
    auto* out = static_cast<float*>(a.out);
    for (int64_t b = 0; b < a.num_seqs; ++b) {
      const KvGatherSeq& s = a.seqs[b];
      const int32_t* table = a.block_tables + static_cast<int64_t>(s.table_row) * a.max_blocks;
      if (s.kv_len > a.max_blocks * g_.block_size)
        return out_of_range(std::string("kv layout `") + Storage::kName + "` gather: " + std::to_string(s.kv_len) +
                            " positions exceed the table's " + std::to_string(a.max_blocks) + " blocks");
      for (int64_t t = 0; t < s.kv_len; ++t) {
        const int32_t page = table[t / g_.block_size];
        if (page < 0)
          return out_of_range(std::string("kv layout `") + Storage::kName + "` gather: no page for position " +
                              std::to_string(t));
        const int64_t slot = static_cast<int64_t>(page) * g_.block_size + t % g_.block_size;
        Storage::load(pages + slot * row_, out + (s.key_start + t) * row_, row_);
      }
    }
    return ok_status();
  }

  Status attend(const MlaAttendArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.cache == nullptr || a.q == nullptr || a.out == nullptr || a.block_tables == nullptr ||
        a.query_seq == nullptr || a.kv_len == nullptr)
      return invalid_argument(std::string("kv layout `") + Storage::kName +
                              "` attend: cache, q, out, block_tables, query_seq and kv_len are required");
    if (a.out_lse)
      return unimplemented(std::string("kv layout `") + Storage::kName +
                           "` attend on the CPU writes no log-sum-exp (out_lse is CUDA's; CPU ranks merge through "
                           "cpu::mla_attention_absorbed_partial)");
    // Resolve every query's visible positions to cache slots first, so errors surface before any work.
    std::vector<std::vector<int64_t>> slots(a.num_queries);
    for (int64_t i = 0; i < a.num_queries; ++i) KILN_RETURN_IF_ERROR(visible_slots(a, i, slots[i]));

    const auto* rows = static_cast<const Element*>(a.cache);
#pragma omp parallel
    {
      std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < a.num_queries; ++i) {
        const auto n_keys = static_cast<int64_t>(slots[i].size());
        scratch.resize(a.num_heads * n_keys + row_);
        Storage::attend(a.q + i * a.num_heads * row_, a.num_heads, g_.latent_dim, g_.rope_dim, rows, slots[i].data(),
                        n_keys, a.scale, a.out + i * a.num_heads * g_.latent_dim, scratch.data());
      }
    }
    return ok_status();
  }

 private:
  static Status check_cpu(Stream stream) {
    if (!stream.device.is_cpu())
      return unimplemented(std::string("kv layout `") + Storage::kName + "` runs on the CPU only for now (stream on " +
                           stream.device.to_string() + ")");
    return ok_status();
  }

  Status visible_slots(const MlaAttendArgs& a, int64_t i, std::vector<int64_t>& out) const {
    const int64_t seq = a.query_seq[i];
    const int64_t kv_len = a.kv_len[i];
    if (seq < 0)
      return invalid_argument(std::string("kv layout `") + Storage::kName + "` attend: query " + std::to_string(i) +
                              " has sequence row " + std::to_string(seq));
    if (kv_len < 0 || kv_len > a.max_blocks * g_.block_size)
      return out_of_range(std::string("kv layout `") + Storage::kName + "` attend: query " + std::to_string(i) +
                          " has kv_len " + std::to_string(kv_len) + ", more than its " + std::to_string(a.max_blocks) +
                          " blocks of " + std::to_string(g_.block_size) + " hold");
    auto slot_of = [&](int64_t position, int64_t& slot) -> Status {
      const int32_t page = a.block_tables[seq * a.max_blocks + position / g_.block_size];
      if (page < 0)
        return out_of_range(std::string("kv layout `") + Storage::kName + "` attend: sequence row " +
                            std::to_string(seq) + " has no page for position " + std::to_string(position));
      slot = static_cast<int64_t>(page) * g_.block_size + position % g_.block_size;
      return ok_status();
    };
    int64_t slot = 0;
    if (a.selected == nullptr) {
      out.reserve(kv_len);
      for (int64_t p = 0; p < kv_len; ++p) {
        KILN_RETURN_IF_ERROR(slot_of(p, slot));
        out.push_back(slot);
      }
      return ok_status();
    }
    // DSA: the selected positions below the causal limit, each once, in position order.
    std::vector<char> chosen(kv_len, 0);
    for (int64_t j = 0; j < a.selected_width; ++j) {
      const int32_t p = a.selected[i * a.selected_width + j];
      if (p >= 0 && p < kv_len) chosen[p] = 1;
    }
    for (int64_t p = 0; p < kv_len; ++p) {
      if (!chosen[p]) continue;
      KILN_RETURN_IF_ERROR(slot_of(p, slot));
      out.push_back(slot);
    }
    return ok_status();
  }

  KvGeometry g_;
  int64_t row_;
};

}  // namespace

namespace {

template <class Storage>
Result<std::unique_ptr<KvLayout>> create_layout(const CreateContext& context) {
  KILN_ASSIGN_OR_RETURN(KvGeometry g, kv_geometry(context, Storage::kName));
  return std::unique_ptr<KvLayout>(new PagedMlaKvLayout<Storage>(g));
}

}  // namespace

Result<KvGeometry> kv_geometry(const CreateContext& context, const std::string& name) {
  if (context.model == nullptr)
    return failed_precondition("kv layout `" + name + "` needs the model's dimensions (kv_lora_rank, qk_rope_head_dim)");
  KvGeometry g;
  g.latent_dim = context.model->kv_lora_rank;
  g.rope_dim = context.model->qk_rope_head_dim;
  g.block_size = context.section ? context.section->get_int("block_size", kDefaultKvBlockSize) : kDefaultKvBlockSize;
  if (g.block_size < 1) return context.section->error("block_size", "must be at least 1, got " + std::to_string(g.block_size));
  if (g.latent_dim <= 0 || g.rope_dim < 0)
    return invalid_argument("kv layout `" + name + "`: model has kv_lora_rank " + std::to_string(g.latent_dim) +
                            " and qk_rope_head_dim " + std::to_string(g.rope_dim) + "; MLA needs kv_lora_rank > 0");
  return g;
}

Result<std::unique_ptr<KvLayout>> create_bf16_kv_layout(const CreateContext& context) {
  if (context.device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    return create_bf16_kv_layout_cuda(context);
#else
    return unimplemented("kv layout `bf16` on CUDA is not in this build (KILN_WITH_CUDA=OFF)");
#endif
  }
  return create_layout<Bf16Storage>(context);
}

Result<std::unique_ptr<KvLayout>> create_fp32_kv_layout(const CreateContext& context) {
  return create_layout<F32Storage>(context);
}

}  // namespace kiln::builtin
