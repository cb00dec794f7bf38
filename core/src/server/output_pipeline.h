// Turns one request's generated token ids into ordered output pieces:
//   ids → StreamingDecoder (whole UTF-8 characters; special tokens as text only where a parser reads them: see
//   skip_special_tokens) → stop strings → reasoning split (glm45) → tool-call parsing (glm47, deepseek_v3).
// Used the same way for streamed and non-streamed responses, so both produce identical text.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "server/output_piece.h"
#include "server/reasoning_parser.h"
#include "server/stop_string_matcher.h"
#include "server/tool_call_parser.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct OutputPipelineOptions {
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_token_ids;  // end-of-turn tokens: they end generation and produce no text
  bool split_reasoning = false;         // run the glm45 reasoning parser
  bool starts_in_reasoning = false;     // the prompt ended inside <think>
  std::string tool_parser;              // the tool-call parser to run ("glm47", "deepseek_v3"; "": none)
  std::string forced_tool_name;         // the prompt opened a call to this function (tool_choice naming it)
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  // The request's skip_special_tokens (vLLM's, default true): special tokens produce no text, except <think> and
  // </think> (the reasoning split reads them, and without it they still mark where the reasoning ends) and, when the
  // request offers tools, every one (a tool-call parser reads its markers; without one the calls stay in the text
  // whole; vLLM turns the skipping off for tool calls the same way). Stop strings match the text after skipping.
  bool skip_special_tokens = true;
};

class OutputPipeline {
 public:
  OutputPipeline(const Tokenizer& tokenizer, OutputPipelineOptions options);

  OutputPieces feed_token(int32_t id);
  // The answer text the prompt already ends with (the opening of a forced tool call): parsed as output before the
  // first token.
  OutputPieces start(const std::string& prefill);
  // End of generation: everything still held back.
  OutputPieces finish();

  bool stopped_by_string() const { return stop_.matched(); }
  const std::vector<ParsedToolCall>& tool_calls() const;

 private:
  OutputPieces route(const std::string& text, bool final);

  OutputPipelineOptions options_;
  const Tokenizer& tokenizer_;
  bool skip_special_ = false;
  std::unordered_set<int32_t> kept_special_;  // read by a parser although skip_special_
  StreamingDecoder decoder_;
  StopStringMatcher stop_;
  std::unordered_set<int32_t> stop_ids_;
  std::optional<ReasoningParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
};

// "call_" + 24 random alphanumerics, like OpenAI's ids (also "chatcmpl-", "resp_", ... with other prefixes).
std::string random_id(const std::string& prefix, int length = 24);

}  // namespace kiln
