// The DFlash / DFlash2 drafter's forward on the host (fp32 arithmetic over the checkpoint's values):
// ../shared/specs/dflash2.md §3 (context K/V, block attention), §4 (the two-tap dynamic conv) and §5 (the candidate
// selector walk). The context K/V lives in the engine's paged cache (one K and one V row per position and layer,
// in bf16 or fp8 e4m3: speculative.draft_kv_dtype); the block's own K/V is never stored.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "dflash_config.h"
#include "dflash_weights.h"

namespace kiln::dflash {

enum class KvDtype { kBf16, kFp8 };

// One sequence's pages in the drafter's cache: layer l's K rows at k[l], V rows at v[l] (row r of page b is
// position b · block_size + r; the block table maps positions to pages).
struct SequenceCache {
  std::vector<uint8_t*> k, v;
  const int32_t* block_table = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
};

// What the block forward needs from the target: its embedding of ids and its lm_head over normed rows.
struct TargetHead {
  virtual ~TargetHead() = default;
  virtual Status embed(const int32_t* ids, int64_t n, float* out) = 0;  // out [n, H]
  virtual Status lm_head(const float* hidden, int64_t n, float* logits) = 0;  // logits [n, V]
};

struct BlockDrafts {
  std::vector<int32_t> tokens;  // K drafts
  // T > 0: q per draft over q_width candidates (ids, probabilities); empty when greedy.
  std::vector<int32_t> q_ids;
  std::vector<float> q_probs;
  int64_t q_width = 0;
};

class DflashModel {
 public:
  DflashModel(DflashConfig config, DflashWeights weights, int64_t target_hidden, KvDtype kv);

  const DflashConfig& config() const { return c_; }
  size_t kv_row_bytes() const;  // one position's K (or V) row of one layer
  // q candidates per draft at T > 0 (v2: the selector's top-k; v1: the likeliest tokens of softmax(logits / T)).
  int64_t q_width() const;

  // Context K/V of positions start .. start + n − 1 from the target's tapped rows: taps[t] + i · tap_stride is row i
  // of tap t (hidden_size floats).
  Status append_context(const std::vector<const float*>& taps, int64_t tap_stride, int64_t n, int64_t start,
                        const SequenceCache& cache);

  // Drafts K tokens after `anchor` at position `anchor_position` (the context holds positions < it). temperature
  // ≤ 0: greedy; else drawn with `rng`, q returned.
  Status draft(int32_t anchor, int64_t anchor_position, int k, float temperature, std::mt19937_64& rng,
               const SequenceCache& cache, TargetHead& target, BlockDrafts& out);
  // The last draft()'s logits [K, vocab] (after output_multiplier and softcap): the CUDA half's tests compare them.
  const std::vector<float>& logits() const { return logits_; }

 private:
  uint8_t* row(const SequenceCache& cache, const std::vector<uint8_t*>& base, int64_t layer, int64_t position) const;
  void encode(const float* x, uint8_t* dst) const;
  void decode(const uint8_t* src, float* x) const;
  void project_key(const LayerWeights& l, const float* x, int64_t position, float* k) const;
  void conv(const DynamicConvWeights& w, int side, const float* d, const float* x, int64_t n, float* y) const;
  void layer_forward(int64_t li, float* h, int64_t n, int64_t anchor_position, const SequenceCache& cache);
  double uniform(std::mt19937_64& rng) const { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

  DflashConfig c_;
  DflashWeights w_;
  int64_t target_hidden_;
  KvDtype kv_;
  // Scratch, reused across calls.
  std::vector<float> feat_, ctx_, x_, q_, k_, v_, d_, attn_, y_, gate_, up_, ctx_k_, ctx_v_, scores_, logits_, normed_;
};

}  // namespace kiln::dflash
