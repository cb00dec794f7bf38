// glm5_next (GLM-5.3-Flash) on one CUDA device, as a ModelInstance: the math of Glm5NextModel::forward with bf16
// activations and fp32 hyper-connected residual streams [N, hc_mult, hidden] (kernels/cuda/mhc). Per layer: the
// attn_hc maps collapse the streams, input_layernorm, then
//   KDA: q | k | v, forget gate, β and output gate projections through the weight format; decode-shaped
//        sequences (≤ kKdaDecodeMaxTokens new tokens) through the fused recurrent kernel, prompt chunks through
//        the short-conv kernel and the chunked tensor-core kernel, both continuing from the sequence's state slot;
//   DSA: runtime/cuda's MLA block (absorbed NoPE attention over the 512-wide latent in the recipe's KvLayout),
//        attending through the pooled indexer's selection (pool keys computed once per complete pool, kept in the
//        layer's third cache entry), shared-indexer layers reusing the previous selection;
// mixed back into the streams; the ffn_hc maps, post_attention_layernorm, runtime/cuda's MLP / MoE block with the
// SwiGLU clamp, mixed back. The mean of the streams, norm, lm_head. Decode-shaped steps replay CUDA graphs.
//
// Tensor parallelism (one process per GPU, create_rank): each rank holds its KDA and DSA heads, dense-MLP columns,
// routed experts and vocabulary rows (load_glm5_next_gpu_weights) and runs the MLA + MoE blocks sharded as the
// MLA + MoE runner does; the KDA heads' outputs are gathered before the whole o_proj. The mHC maps, norms, pooled
// indexer and router are replicated, every gather copies values and every sum has one non-zero contributor per
// element, so a rank computes what one GPU computes. Each rank's pool is its own: its KDA state slots hold the
// largest share of the heads (cache_spec's state_shares), its heads from the start.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/arch/glm5_next/cuda/glm5_next_cuda_weights.h"
#include "model/arch/glm5_next/glm5_next_config.h"
#include "model/model_config.h"
#include "model/model_instance.h"
#include "runtime/cuda/cuda_mla_moe_model.h"
#include "runtime/cuda/cuda_token_selection.h"
#include "runtime/cuda/device_arena.h"

namespace kiln::glm5_next::cuda {

// Sequences bringing at most this many tokens run the fused recurrent KDA kernel (decode, verification of 1 + K
// rows); more, the chunked prefill kernels. So a sequence's decode-time rows always take one arithmetic path.
inline constexpr int64_t kKdaDecodeMaxTokens = 16;

class Glm5NextCudaModel final : public ModelInstance {
 public:
  static Result<std::unique_ptr<Glm5NextCudaModel>> create(const Glm5NextConfig& config, const BuildContext& ctx,
                                                           TensorShard shard = {});
  // This process's rank of a tensor-parallel group (ctx.collective spans parallel.tensor processes).
  static Result<std::unique_ptr<Glm5NextCudaModel>> create_rank(const Glm5NextConfig& config, const BuildContext& ctx);
  ~Glm5NextCudaModel() override;
  // Why this config cannot run on the CUDA kernels (head widths they are built for), or ok.
  static Status supports(const Glm5NextConfig& config);

  Device device() const override;
  DeviceContext& device_context() override;
  size_t weight_bytes() const override { return weights_.bytes; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  int64_t num_mtp_layers() const override { return static_cast<int64_t>(weights_.mtp.size()); }
  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const CacheViews& caches,
              const StepOptions& options, StepOutput& out) override;
  // As CudaMlaMoeModel's (runtime/cuda/batch_invariant_bound.h), with the KDA and pooled-indexer projections.
  BatchInvariance batch_invariance() const override;
  Status mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, const CacheViews& caches,
                  MtpStepOutput& out) override;
  Status embed(const int32_t* ids, int64_t n, TensorView out) override;
  Status lm_head(const TensorView& hidden, float* logits) override;
  Status sample_drafts(const DraftSampleRequest& request) override;
  void set_graphs(bool on) override { graphs_ = on; }
  void set_step_profiling(bool on) override;
  std::vector<std::pair<std::string, double>> step_profile() const override;
  int64_t profiled_steps() const override;
  void clear_step_profile() override;

  // The step's glm5_next-specific host layout (KDA launch groups, pools), built beside runtime/cuda's StepLayout.
  struct Plan;

 private:
  Glm5NextCudaModel(Glm5NextConfig config, kiln::cuda::CudaDeviceContext& dev);
  // One step of the trunk (mtp_index < 0) or of next-n layer mtp_index over `prev_hidden` (device fp32 [N, hidden]);
  // leaves the logits in the step's buffers.
  Status run_step(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                  const CacheViews& caches, const StepOptions& options, std::vector<int64_t>& first_row);

  Glm5NextConfig config_;
  ModelConfig mla_;  // the DSA attention's and MoE's shapes, as runtime/cuda's blocks read them
  std::unique_ptr<kiln::cuda::CudaMlaMoeModel::Impl> impl_;
  Glm5NextGpuWeights weights_;
  std::unique_ptr<Plan> plan_;
  std::vector<uint16_t> media_rows_;  // a step's media rows in bf16 on their way to the device
  kiln::cuda::PinnedUploadRing plan_upload_;
  kiln::cuda::DeviceTokenSelection selection_;
  bool graphs_ = true;
  kiln::cuda::GrowingDeviceBuffer drafter_scratch_;  // a rank's embed() / lm_head() scratch outside a step
  float* mtp_hidden_ = nullptr;  // the last next-n step's output rows (device memory of its own)
  int64_t mtp_hidden_rows_ = 0;  // its capacity in floats
};

}  // namespace kiln::glm5_next::cuda
