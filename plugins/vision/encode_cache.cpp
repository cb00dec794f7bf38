#include "encode_cache.h"

#include <string_view>

namespace kiln::vision {

uint64_t EncodeCache::hash_of(const std::vector<uint8_t>& bytes) {
  return std::hash<std::string_view>{}(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

std::optional<MediaEmbedding> EncodeCache::find(const std::vector<uint8_t>& bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto [first, last] = index_.equal_range(hash_of(bytes));
  for (auto it = first; it != last; ++it) {
    if (it->second->bytes != bytes) continue;
    entries_.splice(entries_.begin(), entries_, it->second);
    ++hits_;
    return entries_.front().encoded;
  }
  return std::nullopt;
}

void EncodeCache::insert(const std::vector<uint8_t>& bytes, const MediaEmbedding& encoded) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry e{hash_of(bytes), bytes, encoded};
  const uint64_t size = e.size();
  if (size > capacity_) return;
  const auto [first, last] = index_.equal_range(e.hash);
  for (auto it = first; it != last; ++it)
    if (it->second->bytes == bytes) return;  // encoded meanwhile by another request
  while (used_ + size > capacity_ && !entries_.empty()) {
    const Entry& old = entries_.back();
    const auto [f, l] = index_.equal_range(old.hash);
    for (auto it = f; it != l; ++it)
      if (it->second == std::prev(entries_.end())) {
        index_.erase(it);
        break;
      }
    used_ -= old.size();
    entries_.pop_back();
  }
  entries_.push_front(std::move(e));
  index_.emplace(entries_.front().hash, entries_.begin());
  used_ += size;
}

}  // namespace kiln::vision
