// The architecture registry: one entry per config.json `model_type` kiln runs. An architecture parses its config,
// declares what each layer caches (CacheSpec: paged MLA latents, paged indexer keys, per-sequence state slots),
// and builds its step on a device (CPU and CUDA) from the SDK pieces: linears and experts through the recipe's
// WeightFormat, attention through its KvLayout.
//
// Adding an architecture: a folder model/arch/<name>/ with its parse function, and one line in
// model/arch/registry.cpp. Members of the MLA + MoE family (glm4_moe_lite, glm_moe_dsa, deepseek_v3) are thin: a
// MlaMoeVariant of config rules over the family's shared blocks (model/mla_moe_*, runtime/cuda/cuda_*_block.cpp).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "kiln/cache_spec.h"
#include "kiln/device.h"
#include "kiln/indexer_key_format.h"
#include "kiln/model_info.h"
#include "kiln/status.h"
#include "model/precision.h"

namespace kiln {

class ModelInstance;
struct BuildContext;

class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual const std::string& model_type() const = 0;
  virtual const std::string& source() const = 0;  // the config.json it was read from, for messages
  virtual ModelInfo info() const = 0;
  virtual std::vector<int64_t> eos_token_ids() const = 0;
  // What each target layer caches, then each of the first `mtp_layers` next-n layers (indexed after them). `keys`
  // is the recipe's KV layout's choice for a DSA indexer's key cache (KvLayout::indexer_key_format); an
  // architecture without such a cache ignores it, one whose indexer caches something else says why it does.
  // `state_shares`: ranks of a tensor-parallel group that each hold a pool of their own (one process per rank) and
  // keep only their heads' part of a sequence's state, so a state slot needs the largest share (1: every head).
  virtual CacheSpec cache_spec(int64_t mtp_layers, IndexerKeyFormat keys, int state_shares = 1) const = 0;
  // Why this model cannot run on `device` (shapes its kernels do not take), or ok.
  virtual Status supports(DeviceType device) const = 0;
  // Why its CPU path cannot run in `precision` (model.precision), or ok; asked at load and by `kiln recipe check`.
  virtual Status supports_precision(Precision precision) const { return ok_status(); }
  // Why `tensor` ranks (parallel.tensor) in decode-context groups of `decode_context` on `device` cannot split this
  // model (its shapes, or a runner that does not shard), naming the config field or setting, or ok; asked by `kiln
  // recipe check`, and by build at load, so the two say the same thing.
  virtual Status supports_parallel(int tensor, int decode_context, DeviceType device) const { return ok_status(); }
  // The model on ctx's device: weights through its WeightFormat, attention through its KvLayout.
  virtual Result<std::unique_ptr<ModelInstance>> build(const BuildContext& ctx) const = 0;
};

struct ArchitectureEntry {
  const char* model_type;
  const char* description;
  Result<std::unique_ptr<Architecture>> (*parse)(const nlohmann::json& config, const std::string& source);
};

// Every registered architecture (model/arch/registry.cpp).
const std::vector<ArchitectureEntry>& architectures();
const ArchitectureEntry* find_architecture(const std::string& model_type);
// "deepseek_v3, glm4_moe_lite, glm_moe_dsa"
std::string architecture_names();

// The architecture config.json's `model_type` names, with its config read (errors name the file and field).
Result<std::unique_ptr<Architecture>> parse_architecture(const nlohmann::json& config, const std::string& source);
Result<std::unique_ptr<Architecture>> load_architecture(const std::filesystem::path& config_json);

}  // namespace kiln
