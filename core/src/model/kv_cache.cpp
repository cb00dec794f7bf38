#include "model/kv_cache.h"

#include <string>

namespace kiln {

KvCache::KvCache(std::shared_ptr<KvLayout> layout, int64_t num_layers, int64_t num_blocks, int64_t index_head_dim,
                 int64_t first_layer)
    : layout_(std::move(layout)),
      block_size_(layout_->geometry().block_size),
      num_blocks_(num_blocks),
      index_head_dim_(index_head_dim) {
  const size_t layer_bytes = static_cast<size_t>(num_blocks) * block_size_ * layout_->bytes_per_token();
  pages_.resize(num_layers);
  for (int64_t l = first_layer; l < num_layers; ++l) pages_[l].resize(layer_bytes);
  if (index_head_dim > 0) {
    indexer_.resize(num_layers);
    for (int64_t l = first_layer; l < num_layers; ++l)
      indexer_[l].resize(static_cast<size_t>(num_blocks) * block_size_ * index_head_dim);
  }
  free_.reserve(num_blocks);
  // Hand out low block ids first (pop_back), so small runs touch the start of each layer's pages.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

Status KvCache::reserve(std::vector<int32_t>& table, int64_t tokens) {
  const int64_t needed = (tokens + block_size_ - 1) / block_size_ - static_cast<int64_t>(table.size());
  if (needed <= 0) return ok_status();
  if (needed > free_blocks())
    return resource_exhausted("KV cache full: " + std::to_string(tokens) + " tokens need " + std::to_string(needed) +
                              " more blocks of " + std::to_string(block_size_) + ", " + std::to_string(free_blocks()) +
                              " free of " + std::to_string(num_blocks_));
  for (int64_t i = 0; i < needed; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return ok_status();
}

void KvCache::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
  table.clear();
}

size_t KvCache::bytes() const {
  size_t n = 0;
  for (const auto& p : pages_) n += p.size();
  for (const auto& k : indexer_) n += k.size() * sizeof(float);
  return n;
}

}  // namespace kiln
