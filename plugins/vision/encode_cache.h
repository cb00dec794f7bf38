// Recent images' encodings, so a repeated image (the same bytes: a conversation resending its picture every turn)
// skips decoding, processing and the tower. Bounded by bytes, least recently used out first; a hit compares the
// bytes in full, so two images never share an entry whatever their hashes.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kiln/modality.h"

namespace kiln::vision {

class EncodeCache {
 public:
  explicit EncodeCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  std::optional<MediaEmbedding> find(const std::vector<uint8_t>& bytes);
  void insert(const std::vector<uint8_t>& bytes, const MediaEmbedding& encoded);

  uint64_t hits() const { return hits_; }

 private:
  struct Entry {
    uint64_t hash;
    std::vector<uint8_t> bytes;
    MediaEmbedding encoded;
    uint64_t size() const {
      return bytes.size() + encoded.embeddings.size() * sizeof(float) + encoded.tokens.size() * sizeof(int32_t);
    }
  };
  static uint64_t hash_of(const std::vector<uint8_t>& bytes);

  std::mutex mutex_;
  uint64_t capacity_;
  uint64_t used_ = 0;
  std::atomic<uint64_t> hits_{0};
  std::list<Entry> entries_;  // most recently used first
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> index_;
};

}  // namespace kiln::vision
