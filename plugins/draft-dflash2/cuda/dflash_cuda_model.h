// The DFlash / DFlash2 drafter's forward on a CUDA device: the host model's arithmetic (dflash_model.h) with the
// projections as the recipe weight format's Linear objects (dense bf16 on CUDA) and the rest in the plugin's kernels
// (dflash_cuda_kernels.h). One run() enqueues a whole propose() step for every sequence at once — the context rows'
// K/V (in chunks of kContextChunk rows), then one forward over all drafting sequences' blocks, top-k, and the draft
// walk — on the device's stream, with a single host→device copy of the step's metadata and no synchronisation; the
// caller copies the drafts back (tokens()) with the one wait of the step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dflash_config.h"
#include "dflash_model.h"
#include "kiln/draft_services.h"
#include "kiln/weight_format.h"

namespace kiln::dflash {

// A target row that extends a sequence's context: its row in the step's taps, its position and its cache slot
// (page · block_size + position % block_size).
struct ContextRow {
  int32_t tap_row = 0;
  int64_t position = 0;
  int64_t slot = 0;
};

// One sequence's block to draft: [anchor, MASK × depth] at anchor_position ..; its block table (host) covers the
// context it reads. uniforms: `depth` draws in [0, 1) when temperature > 0.
struct DraftBlock {
  int32_t anchor = 0;
  int64_t anchor_position = 0;
  int depth = 0;
  float temperature = 0.0f;
  const int32_t* block_table = nullptr;
  int64_t num_blocks = 0;
  std::vector<double> uniforms;
};

class DflashCudaModel {
 public:
  // Loads the checkpoint's projections through services.weight_format() and uploads norms, conv kernels and the
  // selector's codebooks; `host` are the checkpoint's values as the host model reads them.
  static Result<std::unique_ptr<DflashCudaModel>> load(DraftServices& services, const WeightSource& source,
                                                       DflashConfig config, const DflashWeights& host, KvDtype kv);
  ~DflashCudaModel();

  const DflashConfig& config() const { return c_; }
  size_t kv_row_bytes() const;
  int64_t q_width(bool sampled) const;  // candidates per draft in q (and in the walk)

  // Enqueues the step: context K/V of `rows` (from `taps`, [step rows, hidden] fp32 each, on the device) into the
  // drafter's caches, then the drafts of `blocks`.
  Status run(const std::vector<TensorView>& taps, const std::vector<ContextRow>& rows,
             const std::vector<DraftBlock>& blocks);

  // After run(), on the device: block b's drafts are rows first_row(b) .. + depth − 1 of these.
  int64_t first_row(size_t b) const { return first_rows_[b]; }
  int64_t draft_rows() const { return draft_rows_; }
  const int32_t* tokens() const { return tokens_; }
  const int32_t* q_ids() const { return q_ids_; }   // [draft rows, walk width]
  const float* q_probs() const { return q_probs_; }
  int64_t walk_width() const { return walk_width_; }
  const float* logits() const { return logits_; }   // [draft rows, vocab]: the target's lm_head, before the multiplier

 private:
  struct Impl;
  DflashCudaModel(DraftServices& services, DflashConfig config, KvDtype kv);
  Status ensure_block_capacity(int64_t rows, int64_t draft_rows, int64_t width);
  Status forward_context(const std::vector<TensorView>& taps, int64_t rows);
  Status forward_blocks(int64_t rows, int64_t draft_rows, int64_t seqs);
  Result<void*> device_alloc(size_t bytes, const char* what);

  DraftServices& s_;
  DflashConfig c_;
  KvDtype kv_;
  std::unique_ptr<Impl> m_;
  std::vector<int64_t> first_rows_;
  int64_t draft_rows_ = 0, walk_width_ = 0;
  int32_t* tokens_ = nullptr;
  int32_t* q_ids_ = nullptr;
  float* q_probs_ = nullptr;
  float* logits_ = nullptr;
};

}  // namespace kiln::dflash
