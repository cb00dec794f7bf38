// The "glm47" tool-call parser: GLM-4.5/4.7/5 write calls as
//   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
// (GLM-4.5 puts newlines between the parts; whitespace between tags, and around a value, is ignored). String values
// are raw text, other values JSON. The parser turns this into OpenAI tool calls whose `arguments` is a JSON object
// string, incrementally: the call's name as soon as it is complete, then argument text as it arrives (string values
// character by character, other values when their </arg_value> closes). The concatenation of the argument
// deltas of a call is exactly its final arguments string.
// A value is a string when the tool's JSON schema says so; otherwise it is parsed as JSON, falling back to a
// string when it is not valid JSON (models write bare words for enums).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_call_parser.h"

namespace kiln {

class GlmToolCallParser final : public ToolCallParser {
 public:
  // `tools`: the request's OpenAI tools ([{type: function, function: {name, parameters}}]), for argument types.
  // `make_id` names each call ("call_…").
  GlmToolCallParser(const nlohmann::ordered_json& tools, std::function<std::string()> make_id);

  OutputPieces feed(std::string_view text) override;
  // The prompt ended with "<tool_call>NAME": the next text is "<arg_key>…" or "</tool_call>".
  OutputPieces begin_call(const std::string& name) override;
  // A call cut off before its name is returned as content; one cut off later stays as streamed.
  OutputPieces flush() override;

  const std::vector<ParsedToolCall>& calls() const override { return calls_; }

 private:
  enum class State { kText, kName, kKey, kBeforeValue, kValue, kAfterValue };
  bool step(OutputPieces& out);  // consumes what it can from pending_; false when it needs more text
  void emit_arguments(OutputPieces& out, const std::string& text);
  void start_call(OutputPieces& out, const std::string& name);
  bool value_is_string(const std::string& key) const;

  nlohmann::ordered_json tools_;
  std::function<std::string()> make_id_;
  State state_ = State::kText;
  std::string pending_;
  std::string key_;
  bool streaming_string_ = false;
  bool value_started_ = false;  // a string value's first non-space character arrived
  int args_in_call_ = 0;
  std::vector<ParsedToolCall> calls_;
};

}  // namespace kiln
