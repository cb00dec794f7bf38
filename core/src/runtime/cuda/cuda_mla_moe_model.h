// The MLA + MoE forward pass (glm4_moe_lite, deepseek_v3) on one CUDA device: the math of MlaMoeModel::forward
// with bf16 weights and activations, an fp32 residual stream, and attention always in absorbed form over the
// paged bf16 latent cache. Every query row, prefill included, goes through the decode attention kernel: correct
// but not fast for long prompts (no tensor-core prefill kernel yet). The checkpoint's next-n (MTP) layers run
// through mtp_forward() over a KV pool of their own (CudaMtpDraftHost). DSA (glm_moe_dsa) runs its lightning
// indexer over an fp32 key cache in the pool and attends through the reference kernel with the selection.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/model_runner.h"
#include "model/model_config.h"
#include "runtime/cuda/device_arena.h"
#include "runtime/cuda/gpu_kv_pool.h"
#include "runtime/cuda/gpu_weights.h"

namespace kiln::cuda {

class CudaMlaMoeModel {
 public:
  // source == nullptr: dummy weights from `seed`. Uses the current CUDA device. With `load_mtp`, the next-n
  // layers are uploaded too (see load_gpu_weights).
  static Result<std::shared_ptr<CudaMlaMoeModel>> create(const ModelConfig& config, const WeightSource* source,
                                                         uint64_t seed = 1, bool load_mtp = false);
  ~CudaMlaMoeModel();

  const ModelConfig& config() const { return config_; }
  size_t weight_bytes() const { return weights_.bytes; }
  int64_t num_mtp_layers() const { return static_cast<int64_t>(weights_.mtp.size()); }
  // Why this model cannot run on the CUDA runner (half-split rope, odd MoE widths, indexer shapes), or ok.
  static Status supports(const ModelConfig& config);
  // Whether a CUDA device is visible to this process.
  static bool device_available();
  // The current device's memory: all of it, and what is in use now (by this process or any other).
  static size_t device_total_bytes();
  static size_t device_used_bytes();

  // Decode-shaped steps (one token per sequence) replay a CUDA graph of the whole step, captured once per
  // shape (sequences, logit rows, block-table width, attention splits); on by default.
  void set_cuda_graphs(bool on) { graphs_ = on; }

  // Per-stage GPU time of the steps launched directly (not from a graph): see StepTimer. Off by default.
  void set_step_profiling(bool on);
  // Milliseconds per stage label summed over the profiled steps since the last clear, and their count.
  std::vector<std::pair<std::string, double>> step_profile() const;
  int64_t profiled_steps() const;
  void clear_step_profile();

  // A runner over a fresh KV pool of `num_blocks` blocks. The model must outlive it; one runner at a time
  // (runners share the model's stream and scratch).
  Result<std::unique_ptr<ModelRunner>> make_runner(int64_t num_blocks, int64_t block_size);

  // One batched forward over `kv` (the same contract as ModelRunner::forward).
  Status forward(std::span<const SequenceStep> steps, const GpuKvPool& kv, StepOutput& out, bool keep_hidden);

  // The next-n layer `mtp_index` (MlaMoeModel::mtp_forward's contract): token i of a step is t_{p+1} for
  // position p, row i of `prev_hidden` (host fp32 [tokens, hidden]) the state it conditions on. Its KV is
  // layer `mtp_index` of `kv`. out.hidden is always filled: the layer's output before shared_head.norm.
  Status mtp_forward(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                     const GpuKvPool& kv, StepOutput& out);

 // Device state shared by the step's building blocks (cuda_model_step.h); not for use outside runtime/cuda.
  struct Impl;

 private:
  explicit CudaMlaMoeModel(ModelConfig config);
  // One step of the trunk (mtp_index < 0) or of an MTP layer.
  Status run_step(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden, const GpuKvPool& kv,
                  StepOutput& out, bool keep_hidden);
  ModelConfig config_;
  GpuWeights weights_;
  std::unique_ptr<Impl> impl_;
  bool graphs_ = true;
};

}  // namespace kiln::cuda
