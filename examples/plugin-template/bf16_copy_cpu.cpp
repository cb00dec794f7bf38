// The host half of `bf16-copy`: plain loops over host memory. Attention follows the built-in CPU layout's recipe
// (fp32 scores, max-subtracted exponentials summed in double, keys in position order), so greedy text through
// either layout is the same; only the order and fusing of the fp32 multiply-adds differ (theirs are vectorised).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bf16_copy_layout.h"

namespace example_plugin {
namespace {

class Bf16CopyCpu final : public kiln::KvLayout {
 public:
  explicit Bf16CopyCpu(const kiln::KvGeometry& g) : g_(g), width_(g.latent_dim + g.rope_dim) {}

  kiln::KvGeometry geometry() const override { return g_; }
  size_t bytes_per_token() const override { return static_cast<size_t>(width_) * sizeof(uint16_t); }
  kiln::Device device() const override { return kiln::Device::cpu(); }

  kiln::Status append(const kiln::KvAppendArgs& a, kiln::Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.norm_weight != nullptr || a.q != nullptr)
      return kiln::invalid_argument("kv layout `bf16-copy` stores final rows; it fuses no prologue");
    if (a.n > 0 && (a.pages == nullptr || a.slots == nullptr || a.rows == nullptr))
      return kiln::invalid_argument("kv layout `bf16-copy` append: null pages, slots or rows");
    auto* pages = static_cast<uint16_t*>(a.pages);
    const int64_t stride = a.row_stride > 0 ? a.row_stride : width_;
    for (int64_t t = 0; t < a.n; ++t) {
      if (a.slots[t] < 0) continue;  // padding
      const float* row = a.rows + t * stride;
      uint16_t* dst = pages + a.slots[t] * width_;
      for (int64_t i = 0; i < width_; ++i) dst[i] = float_to_bf16(row[i]);
    }
    return kiln::ok_status();
  }

  // On the CPU, gather() returns fp32 (the SDK's contract): the stored bf16 values widened exactly.
  kiln::Status gather(const kiln::KvGatherArgs& a, kiln::Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.num_seqs > 0 && (a.pages == nullptr || a.block_tables == nullptr || a.seqs == nullptr || a.out == nullptr))
      return kiln::invalid_argument("kv layout `bf16-copy` gather: null pages, tables, seqs or out");
    const auto* pages = static_cast<const uint16_t*>(a.pages);
    auto* out = static_cast<float*>(a.out);
    for (int64_t b = 0; b < a.num_seqs; ++b) {
      const kiln::KvGatherSeq& s = a.seqs[b];
      for (int64_t t = 0; t < s.kv_len; ++t) {
        int64_t slot = 0;
        KILN_RETURN_IF_ERROR(slot_of(a.block_tables, a.max_blocks, s.table_row, t, slot));
        const uint16_t* src = pages + slot * width_;
        float* dst = out + (s.key_start + t) * width_;
        for (int64_t i = 0; i < width_; ++i) dst[i] = bf16_to_float(src[i]);
      }
    }
    return kiln::ok_status();
  }

  kiln::Status attend(const kiln::MlaAttendArgs& a, kiln::Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_cpu(stream));
    if (a.cache == nullptr || a.q == nullptr || a.out == nullptr || a.block_tables == nullptr ||
        a.query_seq == nullptr || a.kv_len == nullptr)
      return kiln::invalid_argument(
          "kv layout `bf16-copy` attend: cache, q, out, block_tables, query_seq and kv_len are required");
    const auto* pages = static_cast<const uint16_t*>(a.cache);
    const int64_t L = g_.latent_dim;
    std::vector<int64_t> slots;
    std::vector<float> key, scores;
    for (int64_t r = 0; r < a.num_queries; ++r) {
      KILN_RETURN_IF_ERROR(visible_slots(a, r, slots));
      const auto n = static_cast<int64_t>(slots.size());
      scores.assign(a.num_heads * n, 0.0f);
      const float* q = a.q + r * a.num_heads * width_;
      for (int64_t j = 0; j < n; ++j) {
        widen(pages + slots[j] * width_, width_, key);
        for (int64_t h = 0; h < a.num_heads; ++h) {
          const float* qh = q + h * width_;
          float dot = 0.0f;
          for (int64_t i = 0; i < width_; ++i) dot += qh[i] * key[i];
          scores[h * n + j] = a.scale * dot;
        }
      }
      for (int64_t h = 0; h < a.num_heads; ++h) softmax(scores.data() + h * n, n);
      float* out = a.out + r * a.num_heads * L;
      std::fill(out, out + a.num_heads * L, 0.0f);  // no visible key: zeros
      for (int64_t j = 0; j < n; ++j) {
        widen(pages + slots[j] * width_, L, key);
        for (int64_t h = 0; h < a.num_heads; ++h) {
          const float p = scores[h * n + j];
          for (int64_t i = 0; i < L; ++i) out[h * L + i] += p * key[i];
        }
      }
    }
    return kiln::ok_status();
  }

 private:
  static kiln::Status check_cpu(kiln::Stream stream) {
    if (!stream.device.is_cpu())
      return kiln::invalid_argument("kv layout `bf16-copy` (CPU half) called with a stream on " +
                                    stream.device.to_string());
    return kiln::ok_status();
  }

  static void widen(const uint16_t* row, int64_t n, std::vector<float>& out) {
    out.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(row[i]);
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

  kiln::Status slot_of(const int32_t* tables, int64_t max_blocks, int64_t table_row, int64_t position,
                       int64_t& slot) const {
    if (table_row < 0 || position >= max_blocks * g_.block_size)
      return kiln::out_of_range("kv layout `bf16-copy`: position " + std::to_string(position) + " of table row " +
                                std::to_string(table_row) + " is beyond its " + std::to_string(max_blocks) +
                                " blocks of " + std::to_string(g_.block_size));
    const int32_t page = tables[table_row * max_blocks + position / g_.block_size];
    if (page < 0)
      return kiln::out_of_range("kv layout `bf16-copy`: table row " + std::to_string(table_row) +
                                " has no page for position " + std::to_string(position));
    slot = static_cast<int64_t>(page) * g_.block_size + position % g_.block_size;
    return kiln::ok_status();
  }

  // Query r's keys: positions below kv_len[r] — all of them, or the selected ones (each once, however often it is
  // listed; −1 padding and positions at or past kv_len ignored) — in position order, as cache slots.
  kiln::Status visible_slots(const kiln::MlaAttendArgs& a, int64_t r, std::vector<int64_t>& slots) const {
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
    return kiln::ok_status();
  }

  kiln::KvGeometry g_;
  int64_t width_;
};

}  // namespace

std::unique_ptr<kiln::KvLayout> make_bf16_copy_cpu(const kiln::KvGeometry& g) {
  return std::make_unique<Bf16CopyCpu>(g);
}

}  // namespace example_plugin
