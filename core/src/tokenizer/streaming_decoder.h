// Incremental detokenisation for streamed responses: one id in, the text it completes out. Bytes of a
// character split across tokens are held back until the character is complete, so every chunk is valid
// UTF-8 and the concatenation of all chunks plus flush() equals Tokenizer::decode of all the ids.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace kiln {

class StreamingDecoder {
 public:
  // `tokenizer` must outlive the decoder. With skip_special, special tokens produce no text.
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  // Text completed by `id` (possibly empty while a character is incomplete).
  std::string feed(int32_t id);
  // Whatever is still held back, an incomplete character becoming U+FFFD; the decoder is then empty.
  std::string flush();
  // Bytes currently held back (0..3).
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace kiln
