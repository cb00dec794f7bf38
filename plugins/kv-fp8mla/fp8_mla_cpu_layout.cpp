// The host half of `fp8_ds_mla`: rows quantized on append, attention over the fp8 pages themselves (each visible
// row dequantized as it is read: e4m3 · its tile's scale, the rope part widened from bf16), gather as fp32.
// Arithmetic as the built-in CPU layouts: fp32 scores, max-subtracted exponentials summed in double, keys in
// position order, so the only difference from `bf16` is the stored values.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fp8_mla_layout.h"
#include "fp8_mla_row.h"

namespace kiln::fp8mla {
namespace {

class Fp8MlaCpuLayout final : public KvLayout {
 public:
  explicit Fp8MlaCpuLayout(const KvGeometry& g) : g_(g), row_{g.latent_dim, g.rope_dim}, width_(g.latent_dim + g.rope_dim) {}

  KvGeometry geometry() const override { return g_; }
  size_t bytes_per_token() const override { return static_cast<size_t>(row_.bytes()); }
  Device device() const override { return Device::cpu(); }
  // DeepSeek-V3.2's indexer cache beside the fp8 latent: the core's indexer writes and scores e4m3 + fp32 scale rows.
  IndexerKeyFormat indexer_key_format() const override { return IndexerKeyFormat::kFp8E4m3Scaled; }

  Status append(const KvAppendArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.norm_weight != nullptr || a.q != nullptr)
      return invalid_argument("kv layout `fp8_ds_mla` (CPU) stores final rows; it fuses no prologue");
    if (a.n > 0 && (a.pages == nullptr || a.slots == nullptr || a.rows == nullptr))
      return invalid_argument("kv layout `fp8_ds_mla` append: null pages, slots or rows");
    auto* pages = static_cast<uint8_t*>(a.pages);
    const int64_t stride = a.row_stride > 0 ? a.row_stride : width_;
    for (int64_t t = 0; t < a.n; ++t) {
      if (a.slots[t] < 0) continue;  // padding
      encode_row(row_, a.rows + t * stride, pages + a.slots[t] * row_.bytes());
    }
    return ok_status();
  }

  Status gather(const KvGatherArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.num_seqs > 0 && (a.pages == nullptr || a.block_tables == nullptr || a.seqs == nullptr || a.out == nullptr))
      return invalid_argument("kv layout `fp8_ds_mla` gather: null pages, tables, seqs or out");
    const auto* pages = static_cast<const uint8_t*>(a.pages);
    auto* out = static_cast<float*>(a.out);
    for (int64_t b = 0; b < a.num_seqs; ++b) {
      const KvGatherSeq& s = a.seqs[b];
      for (int64_t t = 0; t < s.kv_len; ++t) {
        int64_t slot = 0;
        KILN_RETURN_IF_ERROR(slot_of(a.block_tables, a.max_blocks, s.table_row, t, slot));
        decode_row(row_, pages + slot * row_.bytes(), out + (s.key_start + t) * width_);
      }
    }
    return ok_status();
  }

  Status attend(const MlaAttendArgs& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.cache == nullptr || a.q == nullptr || a.out == nullptr || a.block_tables == nullptr ||
        a.query_seq == nullptr || a.kv_len == nullptr)
      return invalid_argument(
          "kv layout `fp8_ds_mla` attend: cache, q, out, block_tables, query_seq and kv_len are required");
    if (a.out_lse)
      return unimplemented("kv layout `fp8_ds_mla` attend on the CPU writes no log-sum-exp (out_lse is CUDA's)");
    const auto* pages = static_cast<const uint8_t*>(a.cache);
    const int64_t L = g_.latent_dim;
    std::vector<int64_t> slots;
    std::vector<float> keys, scores;
    for (int64_t r = 0; r < a.num_queries; ++r) {
      KILN_RETURN_IF_ERROR(visible_slots(a, r, slots));
      const auto n = static_cast<int64_t>(slots.size());
      keys.resize(static_cast<size_t>(n * width_));
      for (int64_t j = 0; j < n; ++j) decode_row(row_, pages + slots[j] * row_.bytes(), keys.data() + j * width_);
      scores.assign(static_cast<size_t>(a.num_heads * n), 0.0f);
      const float* q = a.q + r * a.num_heads * width_;
      for (int64_t h = 0; h < a.num_heads; ++h) {
        const float* qh = q + h * width_;
        for (int64_t j = 0; j < n; ++j) {
          const float* k = keys.data() + j * width_;
          float dot = 0.0f;
          for (int64_t i = 0; i < width_; ++i) dot += qh[i] * k[i];
          scores[h * n + j] = a.scale * dot;
        }
        softmax(scores.data() + h * n, n);
      }
      float* out = a.out + r * a.num_heads * L;
      std::fill(out, out + a.num_heads * L, 0.0f);  // no visible key: zeros
      for (int64_t h = 0; h < a.num_heads; ++h)
        for (int64_t j = 0; j < n; ++j) {
          const float p = scores[h * n + j];
          const float* k = keys.data() + j * width_;
          for (int64_t i = 0; i < L; ++i) out[h * L + i] += p * k[i];
        }
    }
    return ok_status();
  }

 private:
  static Status check_cpu(Stream stream) {
    if (!stream.device.is_cpu())
      return invalid_argument("kv layout `fp8_ds_mla` (CPU half) called with a stream on " + stream.device.to_string());
    return ok_status();
  }

  static void softmax(float* s, int64_t n) {
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) max = std::max(max, s[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - max);
      sum += s[j];
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) s[j] *= inv;
  }

  Status slot_of(const int32_t* tables, int64_t max_blocks, int64_t table_row, int64_t position, int64_t& slot) const {
    if (table_row < 0 || position >= max_blocks * g_.block_size)
      return out_of_range("kv layout `fp8_ds_mla`: position " + std::to_string(position) + " of table row " +
                          std::to_string(table_row) + " is beyond its " + std::to_string(max_blocks) +
                          " blocks of " + std::to_string(g_.block_size));
    const int32_t page = tables[table_row * max_blocks + position / g_.block_size];
    if (page < 0)
      return out_of_range("kv layout `fp8_ds_mla`: table row " + std::to_string(table_row) +
                          " has no page for position " + std::to_string(position));
    slot = static_cast<int64_t>(page) * g_.block_size + position % g_.block_size;
    return ok_status();
  }

  // Query r's keys: positions below kv_len[r] — all of them, or the selected ones (each once; −1 padding and
  // positions at or past kv_len ignored) — in position order, as cache slots.
  Status visible_slots(const MlaAttendArgs& a, int64_t r, std::vector<int64_t>& slots) const {
    const int64_t kv_len = a.kv_len[r];
    std::vector<char> visible(static_cast<size_t>(std::max<int64_t>(kv_len, 0)), a.selected == nullptr);
    for (int64_t j = 0; a.selected != nullptr && j < a.selected_width; ++j) {
      const int32_t p = a.selected[r * a.selected_width + j];
      if (p >= 0 && p < kv_len) visible[p] = 1;
    }
    slots.clear();
    for (int64_t p = 0; p < kv_len; ++p) {
      if (!visible[p]) continue;
      int64_t slot = 0;
      KILN_RETURN_IF_ERROR(slot_of(a.block_tables, a.max_blocks, a.query_seq[r], p, slot));
      slots.push_back(slot);
    }
    return ok_status();
  }

  KvGeometry g_;
  RowGeometry row_;
  int64_t width_;
};

}  // namespace

std::unique_ptr<KvLayout> make_cpu_layout(const KvGeometry& g) { return std::make_unique<Fp8MlaCpuLayout>(g); }

}  // namespace kiln::fp8mla
