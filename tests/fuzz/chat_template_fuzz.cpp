// JSON → OpenAI messages and tools → the GLM chat template (and its Python-style JSON writer) → tokens. The
// pieces must join to the rendered string, and text from the messages must never yield a special token the
// template did not write.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "tokenizer/bounded_json.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size == 0) return 0;
  nlohmann::ordered_json input;
  std::string error;
  if (!parse_bounded_json(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), input, error)) return 0;
  const nlohmann::ordered_json messages = input.is_object() && input.contains("messages") ? input["messages"] : input;
  auto parsed = parse_chat_messages(messages);
  if (!parsed.ok()) return 0;
  ChatTemplateOptions options;
  options.add_generation_prompt = data[0] & 1;
  options.enable_thinking = data[0] & 2;
  options.clear_thinking = data[0] & 4;
  if (input.is_object() && input.contains("tools")) options.tools = input["tools"];
  auto pieces = render_glm_chat_pieces(*parsed, options);
  auto text = render_glm_chat(*parsed, options);
  fuzz::check(pieces.ok() == text.ok(), "both renderings agree on errors");
  if (!pieces.ok()) return 0;
  std::string joined;
  for (const PromptPiece& piece : *pieces) joined += piece.text;
  fuzz::check(joined == *text, "the pieces join to the rendered string");

  // Special tokens in the ids: as many as the markup pieces alone produce.
  const Tokenizer& tok = fuzz::fixture_tokenizer();
  auto specials = [&](const std::vector<int32_t>& ids) {
    return std::count_if(ids.begin(), ids.end(), [&](int32_t id) { return tok.is_special(id); });
  };
  std::ptrdiff_t markup_specials = 0;
  for (const PromptPiece& piece : *pieces) {
    if (!piece.client_text) markup_specials += specials(tok.encode(piece.text));
  }
  fuzz::check(specials(tok.encode(*pieces)) == markup_specials, "client text produced a special token");
  return 0;
}
