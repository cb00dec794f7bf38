// Constrained decoding for the OpenAI routes: grammars compiled by xgrammar (docs/structured_output.md says why that
// engine) over the tokenizer's vocabulary, and per request a TokenConstraint (engine/token_constraint.h) holding an
// xgrammar matcher that the engine masks each selection with and advances over each accepted token.
// Compiling runs on the HTTP handler's thread, so a slow schema never stalls the engine's step.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/token_constraint.h"
#include "kiln/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

// Where a constrained answer starts. Without reasoning, at the first generated token. With it, the prompt ended
// inside <think> (GLM's reasoning, the glm45 parser): free text up to "</think>" comes first, then the answer's
// grammar; only the answer is held to it, and the request cannot end before the answer is complete.
struct ReasoningPrefix {
  bool enabled = false;
  int64_t max_tokens = -1;  // the reasoning's budget in tokens, after which "</think>" is forced; -1: none
};

// A forced tool call (tool_choice "required" or a named function) in the format of a tool-call parser.
struct ToolCallGrammar {
  std::string parser;    // "glm47" or "deepseek_v3"
  std::string name;      // the named function; empty: "required", any of the tools
  bool parallel = true;  // "required" allows one or more calls; false: exactly one (a named function: always one)
  ReasoningPrefix reasoning;
};

class StructuredOutput {
 public:
  // `vocab_size`: the model's (the width of its logits, at least the tokenizer's); `stop_token_ids`: the tokens that
  // end a turn, the only ones a completed grammar allows. The tokenizer must outlive this.
  StructuredOutput(const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> stop_token_ids);
  ~StructuredOutput();

  // Any JSON object (response_format json_object).
  Result<std::shared_ptr<TokenConstraint>> json_object(const ReasoningPrefix& reasoning = {});
  // JSON valid for `schema` (response_format json_schema). With `strict` false, properties the schema does not
  // list may appear too. A schema xgrammar cannot use is kInvalidArgument with its reason.
  Result<std::shared_ptr<TokenConstraint>> json_schema(const nlohmann::ordered_json& schema, bool strict,
                                                       const ReasoningPrefix& reasoning = {});
  // The forced call(s) after what the prompt wrote (forced_call_opening in tool_call_parser.h): the function's name
  // when not given (one of `tools`), its arguments valid for that function's `parameters` in the parser's form
  // (GLM: <arg_key>/<arg_value>; DeepSeek-V3: JSON in a ```json fence), the call's closing markup, and under
  // "required" with `parallel` more whole calls. With reasoning the prompt opened no call: after "</think>" the
  // grammar writes the opening markup too. `tools` are OpenAI chat-format tools.
  Result<std::shared_ptr<TokenConstraint>> tool_calls(const nlohmann::ordered_json& tools, const ToolCallGrammar& call);

  struct Xgrammar;  // xgrammar's tokenizer info and compiler, built at first use

 private:
  Xgrammar& state();

  const Tokenizer& tokenizer_;
  int64_t vocab_size_;
  std::vector<int32_t> stop_token_ids_;
  std::once_flag once_;
  std::unique_ptr<Xgrammar> xgrammar_;
};

}  // namespace kiln
