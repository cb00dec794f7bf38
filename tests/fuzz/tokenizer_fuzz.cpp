// Text → the fixture tokenizer (GLM's pre-tokenizer regex, byte-level BPE, special tokens) → text. Byte-level
// BPE without a normalizer loses nothing, so decoding gives back the text (with U+FFFD for invalid UTF-8),
// whether special tokens are parsed or not and however the text is cut into prompt pieces.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "tokenizer/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size == 0) return 0;
  const Tokenizer& tok = fuzz::fixture_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string valid = utf8::to_valid_lossy(text);
  fuzz::check(tok.decode(tok.encode(text, /*parse_special=*/false)) == valid, "plain encode/decode round trip");
  fuzz::check(tok.decode(tok.encode(text, /*parse_special=*/true)) == valid, "encode/decode round trip");

  // Cut at valid-text character boundaries every (data[0] % 7 + 1) characters, alternating markup and client.
  std::vector<PromptPiece> pieces;
  const size_t every = data[0] % 7 + 1;
  size_t chars = 0, start = 0;
  for (size_t i = 0; i <= valid.size(); ++i) {
    const bool boundary = i == valid.size() || (static_cast<unsigned char>(valid[i]) & 0xC0) != 0x80;
    if (!boundary) continue;
    if (i == valid.size() || (chars > 0 && chars % every == 0)) {
      pieces.push_back({valid.substr(start, i - start), pieces.size() % 2 == 1});
      start = i;
    }
    ++chars;
  }
  fuzz::check(tok.decode(tok.encode(pieces)) == valid, "prompt-piece encode/decode round trip");
  return 0;
}
