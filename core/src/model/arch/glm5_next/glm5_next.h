// Architecture `glm5_next` (GLM-5.3-Flash): hyper-connected residual streams (mHC), KDA linear-attention layers
// with per-sequence recurrent state, NoPE MLA layers with the pooled DSA indexer, clamped-SwiGLU MoE
// (specs/glm5-next.md). Runs on the CPU (Glm5NextModel, the fp32 reference) and on CUDA (cuda/Glm5NextCudaModel).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/arch/architecture.h"
#include "model/arch/glm5_next/glm5_next_config.h"

namespace kiln::arch {

class Glm5NextArchitecture final : public Architecture {
 public:
  explicit Glm5NextArchitecture(glm5_next::Glm5NextConfig config) : config_(std::move(config)) {}

  const glm5_next::Glm5NextConfig& config() const { return config_; }
  const std::string& model_type() const override { return model_type_; }
  const std::string& source() const override { return config_.source; }
  ModelInfo info() const override { return config_.to_model_info(); }
  std::vector<int64_t> eos_token_ids() const override { return config_.eos_token_ids; }
  // KDA layers: their state slot (recurrent, then conv state); DSA layers: the latent pages, plus the indexer's rows
  // (and pool keys) on layers with an indexer of their own. Next-n (MTP) layers likewise by the kind their checkpoint
  // names show (config().mtp, read at parse time beside the checkpoint); one not stored caches nothing.
  CacheSpec cache_spec(int64_t mtp_layers, IndexerKeyFormat keys, int state_shares = 1) const override;
  Status supports(DeviceType device) const override;
  // Tensor parallelism on CPU ranks needs at least one head, column, expert and vocabulary row per rank;
  // decode-context parallelism splits the DSA layers' latents and indexer rows by token (CPU ranks only; the CUDA
  // runner neither shards nor splits).
  Status supports_parallel(int tensor, int decode_context, DeviceType device) const override;
  Result<std::unique_ptr<ModelInstance>> build(const BuildContext& ctx) const override;

 private:
  glm5_next::Glm5NextConfig config_;
  std::string model_type_ = "glm5_next";
};

// `source` is the config.json's path: when a checkpoint sits beside it, its tensor names give the next-n layers'
// layouts (glm5_next_mtp_layout.h).
Result<std::unique_ptr<Architecture>> parse_glm5_next(const nlohmann::json& config, const std::string& source);

}  // namespace kiln::arch
