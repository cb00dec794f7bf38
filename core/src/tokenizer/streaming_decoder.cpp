#include "tokenizer/streaming_decoder.h"

#include "tokenizer/utf8.h"

namespace kiln {

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string StreamingDecoder::feed(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  const std::size_t held = utf8::incomplete_tail_length(pending_);
  std::string text = utf8::to_valid_lossy(std::string_view(pending_).substr(0, pending_.size() - held));
  pending_.erase(0, pending_.size() - held);
  return text;
}

std::string StreamingDecoder::flush() {
  std::string text = utf8::to_valid_lossy(pending_);
  pending_.clear();
  return text;
}

}  // namespace kiln
