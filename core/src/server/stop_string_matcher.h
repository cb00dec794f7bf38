// Text-level stop strings (OpenAI `stop`): generation ends where the first one appears, and neither it nor
// anything after it is returned. A stop string may span several tokens, so text that could be the start of one
// is held back until the next chunk decides.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // The text that is safe to emit now. After a match, returns the text before it and ignores further input.
  std::string feed(std::string_view text);
  // Whatever was held back, once generation has ended without a match.
  std::string flush();
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool matched_ = false;
};

}  // namespace kiln
