// The MLA + MoE forward pass (glm4_moe_lite, glm_moe_dsa, deepseek_v3) on one CUDA device, as a ModelInstance: the
// math of MlaMoeModel::forward with bf16 activations and an fp32 residual stream. Linears and experts run through
// the recipe's WeightFormat, KV appends and attention through its KvLayout (absorbed form over the pages for decode
// rows; the expanded-form tensor-core prefill kernel over the layout's gathered rows for prompt chunks), in the
// CacheManager's pages. Token selection runs after the step; the next-n (MTP) layers through mtp_step() over the
// same pages. DSA (glm_moe_dsa) runs its lightning indexer over an fp32 key cache (the layer's second cache entry)
// and attends through the selection.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/model_config.h"
#include "model/model_instance.h"
#include "runtime/cuda/cuda_device_context.h"
#include "runtime/cuda/cuda_token_selection.h"
#include "runtime/cuda/device_arena.h"
#include "runtime/cuda/gpu_weights.h"

namespace kiln::cuda {

class CudaMlaMoeModel final : public ModelInstance {
 public:
  // On ctx.device (a CudaDeviceContext): weights through ctx.format from ctx.source, attention through ctx.layout.
  // `shard`: this rank's part of a tensor-parallel group (ctx.source then serves its rows: see create_rank).
  static Result<std::unique_ptr<CudaMlaMoeModel>> create(const ModelConfig& config, const BuildContext& ctx,
                                                         TensorShard shard = {});
  // One process per tensor-parallel rank (ctx.collective spans parallel.tensor processes): this rank's shard of the
  // weights (load_gpu_weights: heads, dense-MLP columns, routed experts and vocabulary rows split as the CPU ranks
  // split them; the shared expert whole on one rank) and a step in which the ranks meet through ctx.collective —
  // gathers of the heads' outputs, the dense MLP's SwiGLU columns and the logits, sums of the embedding rows and
  // the routed pairs, each with one non-zero contributor — so every rank computes every value with the arithmetic
  // of one rank wherever its kernels' launch shapes do not depend on the split widths (at the test fixtures' sizes
  // they do not: tests/gpu). With ctx.decode_context = D > 1 (D = parallel.tensor, supports_decode_context) the ranks
  // also split the KV cache by token: each stores its own positions, attends every head over them and merges the
  // group's partial results by log-sum-exp (cuda_split_context.cpp). MTP drafting works: the next-n layers are
  // split as the trunk's layers and mtp_step() meets the ranks as step() does. embed() and lm_head() outside a step
  // (drafters with a model of their own, e.g. dflash) are vocabulary-parallel as the step's: every rank runs them.
  static Result<std::unique_ptr<CudaMlaMoeModel>> create_rank(const ModelConfig& config, const BuildContext& ctx);
  ~CudaMlaMoeModel() override;

  const ModelConfig& config() const { return config_; }
  // Why this model cannot run on the CUDA runner (half-split rope, odd MoE widths, indexer shapes), or ok.
  static Status supports(const ModelConfig& config);
  // Why `decode_context` ranks of a `tensor`-rank group cannot split this model's KV cache on CUDA, or ok.
  static Status supports_decode_context(const ModelConfig& config, int tensor, int decode_context);

  Device device() const override;
  DeviceContext& device_context() override;
  size_t weight_bytes() const override { return weights_.bytes; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  int64_t num_mtp_layers() const override { return static_cast<int64_t>(weights_.mtp.size()); }
  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const CacheViews& caches,
              const StepOptions& options, StepOutput& out) override;
  // kBatchInvariantMaxRows, the trunk's weight-format promises and the lm_head's (batch_invariant_bound.h).
  BatchInvariance batch_invariance() const override;
  Status mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, const CacheViews& caches,
                  MtpStepOutput& out) override;
  Status embed(const int32_t* ids, int64_t n, TensorView out) override;
  Status lm_head(const TensorView& hidden, float* logits) override;
  Status sample_drafts(const DraftSampleRequest& request) override;

  // Decode-shaped steps (one token per sequence) replay a CUDA graph of the whole step, captured once per
  // shape (sequences, logit rows, block-table width, attention splits); on by default.
  void set_graphs(bool on) override { graphs_ = on; }
  // Per-stage GPU time of the steps launched directly (not from a graph): see StepTimer. Off by default.
  void set_step_profiling(bool on) override;
  std::vector<std::pair<std::string, double>> step_profile() const override;
  int64_t profiled_steps() const override;
  void clear_step_profile() override;

  // Layer-major prefill: a step that is one prompt's chunk of more than this many rows runs each layer over the chunk
  // in tiles of it (tile boundaries at multiples of it, rounded down to whole KV blocks) before the next layer, so
  // the tiles' step buffers are one tile's while each cached key is gathered and expanded through kv_b once per
  // layer — the tiles' keys accumulate in one prefill workspace — instead of once per chunk as chunk-by-chunk steps
  // do. 0: off. Default cuda_prefill_tile_rows() (model/batch_invariance.h: 8192, or KILN_PREFILL_TILE for A/B
  // measurements); tests set small tiles.
  void set_prefill_tile_rows(int64_t rows) { prefill_tile_rows_ = rows; }
  int64_t prefill_tile_rows() const { return prefill_tile_rows_; }

  // Device state shared by the step's building blocks (cuda_model_step.h); not for use outside runtime/cuda.
  struct Impl;

 private:
  CudaMlaMoeModel(ModelConfig config, CudaDeviceContext& dev);
  // One step of the trunk (mtp_index < 0) or of an MTP layer. Leaves the logits in the step's device buffers
  // (logits_device(), logit rows in first_row).
  Status run_step(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                  const CacheViews& caches, const StepOptions& options, std::vector<int64_t>& first_row);
  ModelConfig config_;
  GpuWeights weights_;
  std::unique_ptr<Impl> impl_;
  bool graphs_ = true;
  int64_t prefill_tile_rows_ = 0;  // set_prefill_tile_rows (the constructor reads the default)
  DeviceTokenSelection selection_;
  std::vector<uint16_t> media_rows_;  // a step's media rows in bf16 on their way to the device
  std::unique_ptr<WeightSource> rank_source_;  // a tensor-parallel rank's view of the checkpoint (create_rank)
  // A rank's device scratch for embed() and lm_head() outside a step (vocabulary ids, local logits, gather staging).
  GrowingDeviceBuffer drafter_scratch_;
};

}  // namespace kiln::cuda
