// The KV pool of one model instance: per layer, pages in the KV layout's format, plus (for DSA models) the
// indexer's key cache at the same slots. Blocks are handed out by a free list; sequences own block tables.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/kv_layout.h"

namespace kiln {

class KvCache {
 public:
  // index_head_dim = 0 for models without a DSA indexer. Layers below `first_layer` get no pages: a pool for
  // the MTP layers alone (indexed num_hidden_layers + i, as the model addresses them) skips the trunk's.
  KvCache(std::shared_ptr<KvLayout> layout, int64_t num_layers, int64_t num_blocks, int64_t index_head_dim,
          int64_t first_layer = 0);

  const KvLayout& layout() const { return *layout_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t index_head_dim() const { return index_head_dim_; }

  void* layer_pages(int64_t layer) { return pages_[layer].data(); }
  // Indexer keys of a layer: [num_blocks · block_size, index_head_dim] fp32, addressed by slot.
  float* indexer_keys(int64_t layer) { return indexer_[layer].data(); }

  // Grows `table` until it covers `tokens` positions. Fails, leaving `table` as it was, if the pool runs out.
  Status reserve(std::vector<int32_t>& table, int64_t tokens);
  // Returns every block of `table` to the pool and clears it.
  void release(std::vector<int32_t>& table);

  // Bytes the pool holds, for capacity reports.
  size_t bytes() const;

 private:
  std::shared_ptr<KvLayout> layout_;
  int64_t block_size_, num_blocks_, index_head_dim_;
  std::vector<std::vector<uint8_t>> pages_;
  std::vector<std::vector<float>> indexer_;
  std::vector<int32_t> free_;
};

// slot = block · block_size + offset: where position `pos` of a sequence with `table` lives.
inline int64_t kv_slot(const std::vector<int32_t>& table, int64_t block_size, int64_t pos) {
  return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
}

}  // namespace kiln
