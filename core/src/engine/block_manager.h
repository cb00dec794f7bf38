// Paged KV blocks with prefix caching.
//
// Every sequence owns a BlockTable: position p of the sequence lives in page blocks[p / block_size]. Blocks
// are reference counted. With prefix caching, a block whose block_size tokens are all computed is given a
// hash chained from its parent block's hash (so equal hashes mean equal whole prefixes) and entered in a
// table hash → block; a later sequence with the same leading tokens takes those blocks instead of
// recomputing them. Only full blocks are ever shared and a full block is never written again (a sequence
// always computes at least its last prompt token into a block of its own, see match_prefix), so sharing
// needs no copy-on-write. When a cached block's last user lets go it stays in the table, unreferenced, in
// LRU order; such blocks are evicted (their hash forgotten) only when the free list is empty.
//
// Media (images behind placeholder tokens) join the key: a block overlapping a media item's tokens hashes the
// item's content hash too, so the same placeholder tokens with a different image never share KV.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/status.h"

namespace kiln {

struct BlockTable {
  std::vector<int32_t> blocks;
  // Chained hashes of the leading full, computed blocks (prefix caching only); hashes.size() ≤ blocks.size().
  std::vector<uint64_t> hashes;
};

// A media item's tokens in a sequence: positions [start, start + length), its content hash.
struct MediaSpan {
  int64_t start = 0;
  int64_t length = 0;
  uint64_t hash = 0;
};

struct PrefixCacheStats {
  int64_t queries = 0;  // tokens looked up
  int64_t hits = 0;     // tokens found
};

class BlockManager {
 public:
  // lookahead_slots: positions reserved beyond what a step computes, so a speculative step can write
  // 1 + depth tokens without allocating in the middle of verification.
  BlockManager(int64_t num_blocks, int64_t block_size, bool prefix_caching, int64_t lookahead_slots = 0);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t lookahead_slots() const { return lookahead_slots_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks a new allocation can take: never used, or cached but unreferenced (evictable).
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // Unreferenced blocks still holding a cached prefix.
  int64_t evictable_blocks() const { return static_cast<int64_t>(evictable_.size()); }
  // Blocks a sequence of `positions` positions needs, lookahead included.
  int64_t blocks_for(int64_t positions) const;

  // For a sequence with an empty table: takes the cached blocks matching the longest prefix of `tokens` made of
  // full blocks, leaving at least the last token to compute (it yields the logits), and returns how many tokens
  // they cover (a multiple of block_size). Does not count statistics: see record_query.
  int64_t match_prefix(std::span<const int32_t> tokens, BlockTable& table, std::span<const MediaSpan> media = {});
  void record_query(int64_t queried_tokens, int64_t hit_tokens);
  PrefixCacheStats prefix_stats() const { return stats_; }

  // Whether `table` can grow to cover `positions` positions plus the lookahead.
  bool can_grow(const BlockTable& table, int64_t positions) const;
  // Grows `table` to cover `positions` positions plus the lookahead; fails, changing nothing, when the pool
  // cannot supply the blocks.
  Status grow(BlockTable& table, int64_t positions);
  // Called once the KV of tokens[0, computed) is in the cache: hashes the blocks that became full and
  // publishes them for reuse.
  void commit(BlockTable& table, std::span<const int32_t> tokens, int64_t computed,
              std::span<const MediaSpan> media = {});
  // Drops the table's references (tail blocks first, so the tail of a prefix is evicted before its head).
  void release(BlockTable& table);

 private:
  struct Block {
    int32_t refs = 0;
    bool cached = false;  // in hash_to_block_
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    uint64_t media = 0;  // the media salt it was hashed with (0: none)
    std::list<int32_t>::iterator lru;  // valid while refs == 0 and cached
  };
  int32_t take_block();
  void acquire(int32_t block);
  uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens, uint64_t media) const;
  // The media salt of block `index`: the hashes (and offsets) of the media items its positions overlap; 0 for none.
  uint64_t media_salt(int64_t index, std::span<const MediaSpan> media) const;
  // Exact check behind a hash hit: the block holds these tokens (and media) after this parent.
  bool holds(int32_t block, uint64_t parent, std::span<const int32_t> tokens, uint64_t media) const;

  int64_t num_blocks_, block_size_, lookahead_slots_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> block_tokens_;  // [num_blocks, block_size]: the tokens of each cached block
  std::vector<int32_t> free_;
  std::list<int32_t> evictable_;  // front = least recently released
  std::unordered_map<uint64_t, int32_t> hash_to_block_;
  PrefixCacheStats stats_;
};

}  // namespace kiln
