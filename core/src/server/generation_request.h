// What the three generation routes share: the request they hand to a GenerationSession, the server facts they
// read (model names, limits, parsers), and the parsing of common fields, tools and chat prompts.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_api.h"
#include "server/api_error.h"
#include "server/media_input.h"
#include "server/output_pipeline.h"
#include "server/request_reader.h"
#include "server/structured_output.h"
#include "tokenizer/jinja_chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct ServerContext {
  const Tokenizer* tokenizer = nullptr;
  std::string model_id;
  std::string served_name;
  int64_t max_model_len = 0;
  int64_t max_output_tokens = 0;  // 0 = whatever the context leaves
  bool logprobs_supported = false;  // the engine computes logprobs (Engine::reports_logprobs)
  // The engine applies penalties, logit_bias and min_p (Engine::applies_logit_adjustments), over this vocabulary.
  bool logit_adjustments_supported = false;
  int64_t vocab_size = 0;
  std::vector<int32_t> end_of_turn_ids;
  std::string tool_parser;       // "glm47", "deepseek_v3" or ""
  std::string reasoning_parser;  // "glm45" or ""
  MediaInput* media = nullptr;   // image parts through the recipe's modality (null: none accepted)
  // The checkpoint's template, rendered by Jinja; null: the built-in GLM-4.7 renderer.
  const JinjaChatTemplate* chat_template = nullptr;
  std::vector<std::string> special_token_texts;  // the tokenizer's, escaped in client text (jinja_chat_template.h)
  // Grammars for constrained decoding (response_format, forced tool calls); null where the engine cannot apply
  // token masks (device token selection).
  StructuredOutput* structured_output = nullptr;
};

struct GenerationRequest {
  RequestParams params;
  OutputPipelineOptions output;
  std::string prefill;  // answer text the prompt already ends with
  // params.constraint holds the answer after free reasoning up to "</think>" (ReasoningPrefix), not from the first
  // token: thinking stays on.
  bool constraint_after_reasoning = false;
  std::optional<int64_t> requested_max_tokens;
  int n = 1;  // choices: one engine sequence each (server/choice_set.h)
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // also params.logprobs: how many alternatives (0..20)
  // Echoed in responses.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  nlohmann::ordered_json tool_choice = "auto";
};

// presence_penalty, frequency_penalty, repetition_penalty (a vLLM extension), logit_bias and min_p (chat and
// completions): OpenAI's ranges, and a 400 naming the field where the engine cannot apply a non-default value.
void read_penalty_fields(const ServerContext& ctx, RequestReader& reader, GenerationRequest& request);

// 404 unless `model` is absent or names this server's model (served name or model id).
std::optional<ApiError> check_model(const ServerContext& ctx, RequestReader& reader);

// The most choices one request may ask for (`n`): each is a sequence of its own in the engine.
inline constexpr int kMaxChoices = 16;

// temperature, top_p, top_k, seed, stop, n, stream, stream_options, and the token limit under the first of
// `max_tokens_keys` present (chat accepts max_tokens and max_completion_tokens).
void read_sampling_fields(RequestReader& reader, const std::vector<const char*>& max_tokens_keys,
                          GenerationRequest& request);

// Asks the engine for logprobs with `top` alternatives; 400 naming `field` when this engine cannot compute them.
std::optional<ApiError> request_logprobs(const ServerContext& ctx, int64_t top, const char* field,
                                         GenerationRequest& request);

// Sets the prompt and the final token limit: 400 naming both numbers when prompt + max_tokens exceeds
// max_model_len (the engine would refuse it too; answering here keeps the message in HTTP terms).
std::optional<ApiError> set_prompt(const ServerContext& ctx, std::vector<int32_t> prompt, GenerationRequest& request);

// Where a constrained answer (JSON format, forced tool call) starts: after free reasoning when thinking is on
// (`enable_thinking`, chat_template_kwargs' or the Responses reasoning effort) and the server splits GLM reasoning
// (glm45); from the first token otherwise, as with enable_thinking=false. `budget`: thinking_token_budget (-1: none).
ReasoningPrefix constrained_reasoning(const ServerContext& ctx, bool enable_thinking, int64_t budget = -1);

struct ToolSetup {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // rendered into the prompt (chat format)
  std::string tool_parser;  // the server's, when tools are parsed ("" otherwise)
  // A forced call's opening, appended to the prompt (forced_call_opening); empty when nothing is forced or when
  // the grammar writes it after reasoning.
  std::vector<PromptPiece> opening;
  std::string forced_name;  // the named function, when the opening already names it
  // The rest of a forced call, enforced by a grammar: a tool's name (for "required") and arguments valid for its
  // schema (null where the server has no StructuredOutput: the opening alone then forces the call).
  std::shared_ptr<TokenConstraint> constraint;
  bool reasoning_first = false;  // the constraint lets the model reason before the call
};

// Validates OpenAI chat-format `tools` and `tool_choice` ("auto", "none", "required", {"type":"function",
// "function":{"name"}} or the Responses form {"type":"function","name"}). "required" and a named function force
// the answer to be a call: where the server has a StructuredOutput, a grammar holds it to a tool's name and
// JSON-schema-valid arguments (after reasoning when `reasoning` is enabled; under "required" one or more calls
// unless `parallel` is false), and the prompt opens the call unless the model reasons first.
std::optional<ApiError> setup_tools(const ServerContext& ctx, const nlohmann::ordered_json* tools,
                                    const nlohmann::ordered_json* tool_choice, bool parallel,
                                    const ReasoningPrefix& reasoning, ToolSetup& setup);

// Renders OpenAI chat messages with the checkpoint's template (or the built-in GLM-4.7 one), tokenizes, and fills
// prompt, prefill and output options. `enable_thinking` comes from chat_template_kwargs (default on); a constrained
// answer that does not start after reasoning (constraint_after_reasoning, ToolSetup::reasoning_first) turns it off.
// `template_kwargs` (the request's chat_template_kwargs) reach a Jinja template as variables.
std::optional<ApiError> build_chat_prompt(const ServerContext& ctx, const nlohmann::ordered_json& messages,
                                          const ToolSetup& tools, bool enable_thinking, bool clear_thinking,
                                          GenerationRequest& request,
                                          const nlohmann::ordered_json& template_kwargs = nlohmann::ordered_json::object());

}  // namespace kiln
