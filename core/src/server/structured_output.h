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

class StructuredOutput {
 public:
  // `vocab_size`: the model's (the width of its logits, at least the tokenizer's); `stop_token_ids`: the tokens that
  // end a turn, the only ones a completed grammar allows. The tokenizer must outlive this.
  StructuredOutput(const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> stop_token_ids);
  ~StructuredOutput();

  // Any JSON object (response_format json_object).
  Result<std::shared_ptr<TokenConstraint>> json_object();
  // JSON valid for `schema` (response_format json_schema). With `strict` false, properties the schema does not
  // list may appear too. A schema xgrammar cannot use is kInvalidArgument with its reason.
  Result<std::shared_ptr<TokenConstraint>> json_schema(const nlohmann::ordered_json& schema, bool strict);
  // The rest of a GLM tool call after the prompt opened it with "<tool_call>" (and `name` when a function is named):
  // the function's name when not given (one of `tools`), its arguments in GLM's <arg_key>/<arg_value> form valid for
  // that function's `parameters`, then "</tool_call>". `tools` are OpenAI chat-format tools.
  Result<std::shared_ptr<TokenConstraint>> glm_tool_call(const nlohmann::ordered_json& tools, const std::string& name);

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
