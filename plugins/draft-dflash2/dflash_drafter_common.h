// What the host and CUDA halves of the `dflash` / `dflash2` drafters share: the capabilities a checkpoint implies
// and the per-sequence draft generator (kept on the host by both, so a seed draws the same uniforms on either device).
#pragma once

#include <cstdint>
#include <random>

#include "dflash_config.h"
#include "kiln/drafter.h"

namespace kiln::dflash {

// Independent of the target's acceptance draws, which use the same request seed (a different offset than mtp's).
inline uint64_t draft_seed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * 3;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// u ∈ [0, 1) with 53 bits from one draw: DflashModel::draft's.
inline double draft_uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// `kv_row_bytes`: one position's K (or V) row of one layer in the drafter's cache.
inline DrafterCapabilities dflash_capabilities(const DflashConfig& c, size_t kv_row_bytes) {
  DrafterCapabilities caps;
  caps.tap_layers = c.target_layers;
  caps.max_depth = static_cast<int>(c.block_size - 1);
  caps.parallel_drafting = true;
  caps.has_draft_probs = true;
  caps.needs_draft_model = true;
  for (int64_t l = 0; l < c.layers; ++l) {
    LayerCacheSpec spec;
    spec.entries.push_back({CacheKind::kPagedRows, "dflash_k", kv_row_bytes, 0});
    spec.entries.push_back({CacheKind::kPagedRows, "dflash_v", kv_row_bytes, 0});
    caps.cache_layers.push_back(spec);
  }
  return caps;
}

}  // namespace kiln::dflash
