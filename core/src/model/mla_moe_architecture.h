// The MLA + MoE family as an Architecture: one ModelConfig (its member's MlaMoeVariant decides how config.json
// reads), its cache spec (per layer the MLA latent pages, plus the DSA indexer's key rows on layers that run their
// own indexer), and its step on the CPU (MlaMoeModel) or CUDA (cuda::CudaMlaMoeModel).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/arch/architecture.h"
#include "model/model_config.h"

namespace kiln {

class MlaMoeArchitecture final : public Architecture {
 public:
  explicit MlaMoeArchitecture(ModelConfig config) : config_(std::move(config)) {}

  const ModelConfig& config() const { return config_; }
  const std::string& model_type() const override { return config_.model_type; }
  const std::string& source() const override { return config_.source; }
  ModelInfo info() const override { return config_.to_model_info(); }
  std::vector<int64_t> eos_token_ids() const override { return config_.eos_token_ids; }
  CacheSpec cache_spec(int64_t mtp_layers, IndexerKeyFormat keys, int state_shares = 1) const override;
  Status supports(DeviceType device) const override;
  Status supports_parallel(int tensor, int decode_context, DeviceType device) const override;
  Result<std::unique_ptr<ModelInstance>> build(const BuildContext& ctx) const override;

 private:
  ModelConfig config_;
};

// The family's config when `arch` is a member of it, else null (for what is family-specific: cost models).
inline const ModelConfig* mla_moe_config(const Architecture& arch) {
  const auto* family = dynamic_cast<const MlaMoeArchitecture*>(&arch);
  return family ? &family->config() : nullptr;
}

// An architecture entry's parse function for a member of the family.
Result<std::unique_ptr<Architecture>> parse_mla_moe_architecture(const nlohmann::json& config, const std::string& source,
                                                                 const MlaMoeVariant& variant);

}  // namespace kiln
