#include "server/reasoning_parser.h"

namespace kiln {
namespace {
const std::string kThinkOpen = "<think>";
const std::string kThinkClose = "</think>";
}  // namespace

OutputPieces ReasoningParser::feed(std::string_view text) {
  OutputPieces out;
  pending_ += text;
  while (!pending_.empty()) {
    if (at_start_) {
      // Decide whether the section opens with <think> before emitting anything.
      if (pending_.size() < kThinkOpen.size() && kThinkOpen.compare(0, pending_.size(), pending_) == 0) break;
      if (pending_.compare(0, kThinkOpen.size(), kThinkOpen) == 0) {
        pending_.erase(0, kThinkOpen.size());
        in_reasoning_ = true;
      }
      at_start_ = false;
      continue;
    }
    if (!in_reasoning_) {
      append_text(out, OutputPiece::Kind::kContent, std::move(pending_));
      pending_.clear();
      break;
    }
    size_t close = pending_.find(kThinkClose);
    if (close != std::string::npos) {
      append_text(out, OutputPiece::Kind::kReasoning, pending_.substr(0, close));
      pending_.erase(0, close + kThinkClose.size());
      in_reasoning_ = false;
      continue;
    }
    size_t keep_from = partial_marker_start(pending_, kThinkClose);
    append_text(out, OutputPiece::Kind::kReasoning, pending_.substr(0, keep_from));
    pending_.erase(0, keep_from);
    break;
  }
  return out;
}

OutputPieces ReasoningParser::flush() {
  OutputPieces out;
  append_text(out, in_reasoning_ ? OutputPiece::Kind::kReasoning : OutputPiece::Kind::kContent, std::move(pending_));
  pending_.clear();
  return out;
}

}  // namespace kiln
