// The "deepseek_v3" tool-call parser. DeepSeek-V3 writes its calls as one section of special tokens:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//   …more calls…<｜tool▁calls▁end｜>
// (the checkpoint's chat template writes history calls the same way; whitespace between calls is allowed).
// ARGS is the model's own JSON, not built by the parser as GLM's is, so a call is held back until its
// <｜tool▁call▁end｜> and then checked: a JSON object becomes the call (its name, then its arguments verbatim, in two
// pieces); anything else (an unknown type, no name, arguments that are not a JSON object, a call cut off) is passed
// on as content, markup and all. Streaming therefore goes call by call rather than character by character: the
// price of never sending a client arguments that turn out not to parse.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_call_parser.h"

namespace kiln {

class DeepSeekV3ToolCallParser final : public ToolCallParser {
 public:
  // `tools` is unused (arguments are JSON already) but kept for the common factory signature.
  DeepSeekV3ToolCallParser(const nlohmann::ordered_json& tools, std::function<std::string()> make_id);

  OutputPieces feed(std::string_view text) override;
  // The prompt ended with the call's markup up to "```json\n": the next text is its arguments.
  OutputPieces begin_call(const std::string& name) override;
  OutputPieces flush() override;
  const std::vector<ParsedToolCall>& calls() const override { return calls_; }

  // The markup, for the forced-call prompt and grammar.
  static const std::string kCallsBegin, kCallBegin, kSep, kCallEnd, kCallsEnd;
  // What follows a call's name and what closes its arguments.
  static const std::string kArgumentsOpen, kArgumentsClose;

 private:
  enum class State { kText, kSection, kCall };
  bool step(OutputPieces& out);  // consumes what it can from pending_; false when it needs more text
  // `body`: what stood between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>; false when it is not a call.
  bool emit_call(OutputPieces& out, const std::string& body);

  std::function<std::string()> make_id_;
  State state_ = State::kText;
  std::string pending_;
  std::vector<ParsedToolCall> calls_;
};

}  // namespace kiln
