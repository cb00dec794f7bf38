// What a model caches per layer, declared by its architecture (or by a drafter for its own layers) and allocated
// by the core's CacheManager: paged caches share the engine's block ids (one block table per sequence serves
// every paged cache of every layer), state slots are fixed-size per sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

enum class CacheKind : uint8_t {
  kMlaLatent,  // paged, in the recipe's KV layout (bytes per token: the layout's)
  kPagedRows,  // paged rows of row_bytes per token (e.g. the DSA indexer's keys)
  kState,      // one slot of slot_bytes per sequence (e.g. a linear-attention layer's recurrent + conv state)
};

struct CacheEntry {
  CacheKind kind = CacheKind::kMlaLatent;
  std::string name;      // "mla", "indexer_keys", "kda_state", ...: names it in messages and reports
  size_t row_bytes = 0;  // kPagedRows: bytes per token
  size_t slot_bytes = 0; // kState: bytes per sequence
};

// One layer's caches, in the order its step addresses them.
struct LayerCacheSpec {
  std::vector<CacheEntry> entries;
};

struct CacheSpec {
  std::vector<LayerCacheSpec> layers;

  // Bytes one token occupies over every layer, given the KV layout's bytes per token for kMlaLatent entries.
  size_t bytes_per_token(size_t mla_bytes_per_token) const {
    size_t b = 0;
    for (const auto& l : layers)
      for (const auto& e : l.entries) {
        if (e.kind == CacheKind::kMlaLatent) b += mla_bytes_per_token;
        if (e.kind == CacheKind::kPagedRows) b += e.row_bytes;
      }
    return b;
  }
  // Bytes one sequence's state slots take over every layer.
  size_t bytes_per_sequence() const {
    size_t b = 0;
    for (const auto& l : layers)
      for (const auto& e : l.entries)
        if (e.kind == CacheKind::kState) b += e.slot_bytes;
    return b;
  }
  bool has_state() const { return bytes_per_sequence() > 0; }
};

}  // namespace kiln
