#include "server/stop_string_matcher.h"

#include <algorithm>

#include "server/output_piece.h"

namespace kiln {

std::string StopStringMatcher::feed(std::string_view text) {
  if (matched_) return {};
  if (stops_.empty()) return std::string(text);
  pending_ += text;
  size_t first = std::string::npos;
  for (const auto& stop : stops_) first = std::min(first, pending_.find(stop));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  size_t keep_from = pending_.size();
  for (const auto& stop : stops_) keep_from = std::min(keep_from, partial_marker_start(pending_, stop));
  std::string out = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return matched_ ? std::string() : out;
}

}  // namespace kiln
