// Every tensor glm5_next's loaders read from a checkpoint (glm5_next_weights.cpp for the CPU,
// cuda/glm5_next_cuda_weights.cpp for CUDA), from the config alone, with its shape and how the model holds it once
// loaded; and the vision tower's tensors (plugins/vision reads them under `model.visual.`). The memory model prices
// this list before anything is loaded (engine/glm5_next_memory.h); a test holds it to the fixtures' checkpoints,
// so a tensor added to a loader and not here shows up as a difference in bytes.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/arch/glm5_next/glm5_next_config.h"

namespace kiln::glm5_next {

// How a loaded model holds a tensor — what decides its bytes on each device.
enum class WeightHeld : uint8_t {
  kFormat,     // a projection or an expert, through the recipe's weight format (CUDA dense: bf16; CPU dense: a view of
               // the mapping)
  kEmbedding,  // the embedding: through the format on CUDA, plus a dense bf16 copy where the format quantizes it;
               // a view on the CPU
  kNorm,       // an RMSNorm weight the CUDA runner keeps in bf16 (the CPU model: an fp32 copy)
  kFp32,       // computed with in fp32 on both devices (mHC maps, short conv, dt_bias, A_log, o_norm, router, the
               // indexer's key norm, ape and compress gate): an fp32 copy or upload
};

struct WeightItem {
  // transformers' in-memory name (what the loaders ask Glm5NextTensorNames for); experts carry `{e}` for the expert
  // index, and `count` says how many there are.
  std::string name;
  int64_t out = 1, in = 1;  // a matrix [out, in]; a vector [out] has in = 1 (the short conv: [3·H·dk, kernel])
  int64_t count = 1;
  WeightHeld held = WeightHeld::kFormat;
  int64_t numel() const { return out * in * count; }
  // The name of expert `e` (or the name itself).
  std::string name_of(int64_t e) const;
};

struct WeightInventory {
  std::vector<WeightItem> items;
  // DSA layers loaded (trunk and next-n): each gets derived tensors no checkpoint holds — the CUDA runner's W_UK
  // transposed [heads, latent, nope] bf16, the CPU model's kv_b in fp32 for the absorbed form.
  int64_t dsa_layers = 0;
  int64_t kv_b_numel = 0;  // per DSA layer: heads · (nope + v) · latent
  int64_t w_uk_numel = 0;  // per DSA layer: heads · latent · nope
};

// The trunk under `prefix` ("model.language_model." or the flat "model."), the final norm and the head, and with
// `with_mtp` the next-n layers config.mtp lists (their layouts from the checkpoint's names).
WeightInventory glm5_next_weight_inventory(const Glm5NextConfig& config, const std::string& prefix, bool with_mtp);

// The vision tower's tensors, all fp32 (the tower computes in fp32 on both devices), from config.json's
// vision_config with transformers' defaults (specs/glm5-next.md §6); empty without a vision_config. Sizes only:
// plugins/vision parses and validates the same fields when it loads the tower.
std::vector<WeightItem> glm5_next_vision_inventory(const nlohmann::json& config);

}  // namespace kiln::glm5_next
