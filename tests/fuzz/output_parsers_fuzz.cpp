// Generated text → the glm47 and deepseek_v3 tool-call parsers and the glm45 reasoning parser, fed whole and in chunks
// whose sizes come from the input. Streaming must not change the result, and a call's argument deltas must add up to
// its arguments, which are a JSON object once the call is complete.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "server/deepseek_v3_tool_call_parser.h"
#include "server/glm_tool_call_parser.h"
#include "server/reasoning_parser.h"
#include "tokenizer/utf8.h"

namespace {

using namespace kiln;

struct Flattened {
  std::string content, reasoning;
  std::vector<std::string> names, arguments;
};

void add(Flattened& f, const OutputPieces& pieces) {
  for (const OutputPiece& p : pieces) {
    switch (p.kind) {
      case OutputPiece::Kind::kContent:
        f.content += p.text;
        break;
      case OutputPiece::Kind::kReasoning:
        f.reasoning += p.text;
        break;
      case OutputPiece::Kind::kToolCallStart:
        f.names.push_back(p.tool_name);
        f.arguments.emplace_back();
        break;
      case OutputPiece::Kind::kToolCallArguments:
        fuzz::check(p.tool_index >= 0 && static_cast<size_t>(p.tool_index) < f.arguments.size(),
                    "argument delta for a call that has not started");
        f.arguments[p.tool_index] += p.text;
        break;
    }
  }
}

const nlohmann::ordered_json& tools() {
  static const nlohmann::ordered_json t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  return t;
}

// Chunk boundaries from `sizes` (cycled), over `text`.
template <class Parser>
Flattened run(Parser& parser, const std::string& text, std::string_view sizes) {
  Flattened f;
  size_t pos = 0, i = 0;
  while (pos < text.size()) {
    const size_t n = sizes.empty() ? text.size() : 1 + static_cast<unsigned char>(sizes[i++ % sizes.size()]) % 16;
    add(f, parser.feed(std::string_view(text).substr(pos, n)));
    pos += n;
  }
  add(f, parser.flush());
  return f;
}

// Whole and chunked parsing agree, each call's argument deltas add up to its arguments, and a complete call's
// arguments are a JSON object.
template <class Parser>
void check_tool_parser(const std::string& text, std::string_view sizes) {
  int ids = 0;
  auto make_id = [&ids] { return "call_" + std::to_string(ids++); };
  Parser whole(tools(), make_id), chunked(tools(), make_id);
  const Flattened a = run(whole, text, {});
  const Flattened b = run(chunked, text, sizes);
  fuzz::check(a.content == b.content && a.names == b.names && a.arguments == b.arguments,
              "tool-call parsing depends on chunking");
  fuzz::check(whole.calls().size() == a.names.size(), "one start piece per call");
  for (size_t c = 0; c < whole.calls().size(); ++c) {
    const ParsedToolCall& call = whole.calls()[c];
    fuzz::check(call.arguments == a.arguments[c], "argument deltas add up to the call's arguments");
    if (call.complete) {
      auto parsed = nlohmann::ordered_json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
      fuzz::check(parsed.is_object(), "a complete call's arguments are a JSON object");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // The parsers see decoded text, which is always valid UTF-8.
  const size_t split = 1 + data[0] % 8;
  if (split >= size) return 0;
  const std::string_view sizes(reinterpret_cast<const char*>(data) + 1, split - 1);
  const std::string text =
      utf8::to_valid_lossy(std::string_view(reinterpret_cast<const char*>(data) + split, size - split));

  check_tool_parser<GlmToolCallParser>(text, sizes);
  check_tool_parser<DeepSeekV3ToolCallParser>(text, sizes);

  const bool thinking = data[0] & 0x80;
  ReasoningParser r_whole(thinking), r_chunked(thinking);
  const Flattened r = run(r_whole, text, {});
  const Flattened s = run(r_chunked, text, sizes);
  fuzz::check(r.content == s.content && r.reasoning == s.reasoning, "reasoning split depends on chunking");
  return 0;
}
