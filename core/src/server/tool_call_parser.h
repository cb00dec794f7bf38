// What every tool-call parser does (server.tool_parser picks one): turn a model's tool-call markup in the generated
// text into OpenAI tool calls, incrementally, as ordered output pieces (text outside calls stays content). A call's
// argument deltas concatenate to its final `arguments`, a JSON object string. Parsers never fail: markup they cannot
// read stays in the content.
// Also what the server writes for a forced call (tool_choice "required" or a named function), per format: the
// markup the prompt ends with, so the answer starts inside the call.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/output_piece.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text
  bool complete = false;  // the call's closing markup was seen
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  virtual OutputPieces feed(std::string_view text) = 0;
  // The prompt already opened a call to `name` (forced_call_opening with a name): the call starts now and the
  // generated text continues with its arguments.
  virtual OutputPieces begin_call(const std::string& name) = 0;
  // End of generation: held-back text is content.
  virtual OutputPieces flush() = 0;
  virtual const std::vector<ParsedToolCall>& calls() const = 0;
};

// The server.tool_parser values kiln reads ("none" and "" mean no parser), for messages.
inline constexpr const char* kToolParserNames = "glm47, deepseek_v3, none";
bool is_tool_parser(const std::string& name);

// The parsers that read what a model family writes, for the recipe's "auto" (the server default): the tool-call
// parser and the reasoning parser for a checkpoint's config.json `model_type`. DeepSeek-V3 writes its own call
// markup and does not think (the glm45 reasoning parser would take its whole answer for reasoning); the GLM
// families write GLM-4.7's. A model_type kiln has no parser for gets none (its calls stay in the text).
struct OutputParserNames {
  std::string tool_parser;       // "" = none
  std::string reasoning_parser;  // "" = none
};
OutputParserNames output_parsers_for_model_type(const std::string& model_type);
// Resolves a recipe value: "auto" → the model type's parser, anything else as given.
std::string resolve_tool_parser(const std::string& recipe_value, const std::string& model_type);
std::string resolve_reasoning_parser(const std::string& recipe_value, const std::string& model_type);

// `tools`: the request's OpenAI tools (for argument types); `make_id` names each call ("call_…"). Null for an
// unknown name.
std::unique_ptr<ToolCallParser> make_tool_call_parser(const std::string& name, const nlohmann::ordered_json& tools,
                                                      std::function<std::string()> make_id);

// The markup that opens a forced call in format `parser`, appended to the prompt after the generation prompt:
// for "required" (empty `name`) what precedes the function's name, for a named function everything up to its
// arguments (the name is client text, so special-token look-alikes in it stay text).
std::vector<PromptPiece> forced_call_opening(const std::string& parser, const std::string& name);

}  // namespace kiln
