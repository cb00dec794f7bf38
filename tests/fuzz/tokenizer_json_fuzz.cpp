// A tokenizer.json → Tokenizer::from_json_text, and when it loads, a short encode/decode with it. Malformed
// files must fail with a Status, never crash or throw.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  auto tok = Tokenizer::from_json_text(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  if (!tok.ok()) return 0;
  const auto ids = tok->encode("Hello <|user|> wörld 123\n\tx", /*parse_special=*/true);
  (void)tok->decode(ids);
  for (int32_t id = 0; id < 64 && id < tok->vocab_size(); ++id) (void)tok->token_bytes(id);
  return 0;
}
