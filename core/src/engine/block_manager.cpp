#include "engine/block_manager.h"

#include <algorithm>
#include <string>

namespace kiln {
namespace {
constexpr uint64_t kRootHash = 0x6b696c6e2d6b7600ull;  // parent of a sequence's first block

uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64 finaliser over (h, v): cheap, and every input bit reaches every output bit.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool prefix_caching, int64_t lookahead_slots)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      lookahead_slots_(lookahead_slots),
      prefix_caching_(prefix_caching),
      blocks_(num_blocks) {
  if (prefix_caching_) block_tokens_.resize(static_cast<size_t>(num_blocks) * block_size);
  free_.reserve(num_blocks);
  // Low ids first (taken from the back), so small runs touch the start of the pool.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int64_t BlockManager::blocks_for(int64_t positions) const {
  return (positions + lookahead_slots_ + block_size_ - 1) / block_size_;
}

uint64_t BlockManager::hash_block(uint64_t parent, std::span<const int32_t> tokens, uint64_t media) const {
  uint64_t h = mix(parent, static_cast<uint64_t>(tokens.size()));
  for (int32_t t : tokens) h = mix(h, static_cast<uint32_t>(t));
  return media ? mix(h, media) : h;
}

uint64_t BlockManager::media_salt(int64_t index, std::span<const MediaSpan> media) const {
  const int64_t begin = index * block_size_, end = begin + block_size_;
  uint64_t salt = 0;
  for (const MediaSpan& m : media)
    if (m.start < end && m.start + m.length > begin) salt = mix(mix(salt ? salt : kRootHash, m.hash), m.start);
  return salt;
}

bool BlockManager::holds(int32_t block, uint64_t parent, std::span<const int32_t> tokens, uint64_t media) const {
  if (blocks_[block].parent_hash != parent || blocks_[block].media != media) return false;
  return std::equal(tokens.begin(), tokens.end(), block_tokens_.begin() + static_cast<int64_t>(block) * block_size_);
}

void BlockManager::acquire(int32_t block) {
  Block& b = blocks_[block];
  if (b.refs == 0 && b.cached) evictable_.erase(b.lru);
  ++b.refs;
}

int32_t BlockManager::take_block() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = evictable_.front();
    evictable_.pop_front();
    Block& b = blocks_[id];
    hash_to_block_.erase(b.hash);
    b.cached = false;
  }
  blocks_[id].refs = 1;
  return id;
}

int64_t BlockManager::match_prefix(std::span<const int32_t> tokens, BlockTable& table,
                                   std::span<const MediaSpan> media) {
  if (!prefix_caching_ || !table.blocks.empty() || tokens.empty()) return 0;
  // Full blocks strictly before the last token: that token is always computed, into a block of its own.
  const int64_t candidates = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  uint64_t parent = kRootHash;
  for (int64_t i = 0; i < candidates; ++i) {
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const uint64_t salt = media_salt(i, media);
    const uint64_t h = hash_block(parent, block_tokens, salt);
    auto it = hash_to_block_.find(h);
    if (it == hash_to_block_.end() || !holds(it->second, parent, block_tokens, salt)) break;
    acquire(it->second);
    table.blocks.push_back(it->second);
    table.hashes.push_back(h);
    parent = h;
  }
  return static_cast<int64_t>(table.blocks.size()) * block_size_;
}

void BlockManager::record_query(int64_t queried_tokens, int64_t hit_tokens) {
  stats_.queries += queried_tokens;
  stats_.hits += hit_tokens;
}

bool BlockManager::can_grow(const BlockTable& table, int64_t positions) const {
  return blocks_for(positions) - static_cast<int64_t>(table.blocks.size()) <= free_blocks();
}

Status BlockManager::grow(BlockTable& table, int64_t positions) {
  const int64_t needed = blocks_for(positions) - static_cast<int64_t>(table.blocks.size());
  if (needed <= 0) return ok_status();
  if (needed > free_blocks())
    return resource_exhausted("KV cache full: " + std::to_string(positions) + " positions need " +
                              std::to_string(needed) + " more blocks of " + std::to_string(block_size_) + ", " +
                              std::to_string(free_blocks()) + " free of " + std::to_string(num_blocks_));
  for (int64_t i = 0; i < needed; ++i) table.blocks.push_back(take_block());
  return ok_status();
}

void BlockManager::commit(BlockTable& table, std::span<const int32_t> tokens, int64_t computed,
                          std::span<const MediaSpan> media) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(computed / block_size_, static_cast<int64_t>(table.blocks.size()));
  for (int64_t i = static_cast<int64_t>(table.hashes.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? kRootHash : table.hashes[i - 1];
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const uint64_t salt = media_salt(i, media);
    const uint64_t h = hash_block(parent, block_tokens, salt);
    table.hashes.push_back(h);
    const int32_t id = table.blocks[i];
    Block& b = blocks_[id];
    // Another sequence may have published the same prefix first; then this copy stays private.
    if (b.cached || hash_to_block_.count(h) != 0) continue;
    b.cached = true;
    b.hash = h;
    b.parent_hash = parent;
    b.media = salt;
    std::copy(block_tokens.begin(), block_tokens.end(), block_tokens_.begin() + static_cast<int64_t>(id) * block_size_);
    hash_to_block_.emplace(h, id);
  }
}

void BlockManager::release(BlockTable& table) {
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) {
    Block& b = blocks_[*it];
    if (--b.refs > 0) continue;
    if (b.cached)
      b.lru = evictable_.insert(evictable_.end(), *it);
    else
      free_.push_back(*it);
  }
  table.blocks.clear();
  table.hashes.clear();
}

}  // namespace kiln
