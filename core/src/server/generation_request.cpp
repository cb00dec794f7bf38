#include "server/generation_request.h"

#include <algorithm>
#include <random>

#include "server/structured_output.h"
#include "tokenizer/chat_template.h"

namespace kiln {
namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxLogitBias = 1024;  // OpenAI takes a few hundred; each entry is work on every selected row

ApiError model_not_found(const std::string& model) {
  ApiError e;
  e.http_status = 404;
  e.message = "The model `" + model + "` does not exist.";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

}  // namespace

std::optional<ApiError> check_model(const ServerContext& ctx, RequestReader& reader) {
  auto model = reader.string("model");
  if (!reader.ok()) return reader.error();
  if (model && *model != ctx.served_name && *model != ctx.model_id) return model_not_found(*model);
  return std::nullopt;
}

void read_sampling_fields(RequestReader& reader, const std::vector<const char*>& max_tokens_keys,
                          GenerationRequest& request) {
  for (const char* key : max_tokens_keys) {
    if (auto v = reader.integer(key, 1, INT64_MAX)) {
      request.requested_max_tokens = *v;
      break;
    }
  }
  SamplingOptions& s = request.params.sampling;
  // OpenAI's default temperature is 1; greedy only when asked (temperature 0).
  s.temperature = static_cast<float>(reader.number("temperature", 0.0, 2.0).value_or(1.0));
  s.top_p = static_cast<float>(reader.number("top_p", 1e-9, 1.0).value_or(1.0));
  int64_t top_k = reader.integer("top_k", -1, INT32_MAX).value_or(0);
  s.top_k = top_k < 0 ? 0 : top_k;  // -1 (vLLM) and 0 both mean off
  if (auto seed = reader.integer("seed", INT64_MIN, INT64_MAX)) {
    s.seed = static_cast<uint64_t>(*seed);
  } else {
    s.seed = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32);
  }
  if (auto stop = reader.string_or_list("stop", kMaxStopStrings)) request.output.stop_strings = *stop;
  // vLLM's extension, default true: special tokens a parser does not read produce no text (OutputPipelineOptions).
  request.output.skip_special_tokens = reader.boolean("skip_special_tokens").value_or(true);
  request.n = static_cast<int>(reader.integer("n", 1, kMaxChoices).value_or(1));
  request.stream = reader.boolean("stream").value_or(false);
  if (const auto* opts = reader.value("stream_options")) {
    if (!opts->is_object()) {
      reader.fail(bad_request("'stream_options' must be an object, got " + json_type_phrase(*opts), "stream_options"));
    } else {
      RequestReader options_reader(*opts);
      request.include_usage = options_reader.boolean("include_usage").value_or(false);
      // A kiln extension: "event: prefill_progress" events while the prompt is computed (streams only).
      request.params.report_prefill_progress =
          options_reader.boolean("include_prefill_progress").value_or(false) && request.stream;
      if (!options_reader.ok()) {
        ApiError e = options_reader.error();
        e.param = "stream_options." + e.param;
        reader.fail(e);
      }
    }
  }
}

void read_penalty_fields(const ServerContext& ctx, RequestReader& reader, GenerationRequest& request) {
  SamplingOptions& s = request.params.sampling;
  s.presence_penalty = static_cast<float>(reader.number("presence_penalty", -2.0, 2.0).value_or(0.0));
  s.frequency_penalty = static_cast<float>(reader.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
  s.repetition_penalty = static_cast<float>(reader.number("repetition_penalty", 1e-3, 100.0).value_or(1.0));
  s.min_p = static_cast<float>(reader.number("min_p", 0.0, 1.0).value_or(0.0));
  if (const auto* bias = reader.value("logit_bias")) {
    if (!bias->is_object()) {
      reader.fail(bad_request("'logit_bias' must be an object mapping token ids to values, got " +
                                  json_type_phrase(*bias),
                              "logit_bias"));
    } else if (bias->size() > kMaxLogitBias) {
      reader.fail(bad_request("'logit_bias' may name at most " + std::to_string(kMaxLogitBias) + " tokens, got " +
                                  std::to_string(bias->size()),
                              "logit_bias"));
    } else {
      for (const auto& [key, value] : bias->items()) {
        const std::string where = "logit_bias[\"" + key + "\"]";
        int64_t id = -1;
        const bool digits = !key.empty() && key.size() <= 10 &&
                            std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (digits) id = std::stoll(key);
        if (!digits || id >= ctx.vocab_size) {
          reader.fail(bad_request(where + ": not a token id in [0, " + std::to_string(ctx.vocab_size) + ")",
                                  "logit_bias"));
          break;
        }
        if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0)) {
          reader.fail(bad_request(where + ": the bias must be a number between -100 and 100", "logit_bias"));
          break;
        }
        s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(value.get<double>()));
      }
    }
  }
  if (!reader.ok() || ctx.logit_adjustments_supported) return;
  // Defaults (0, 1, {}) change nothing and pass everywhere; a real value is refused rather than ignored.
  const char* field = s.presence_penalty != 0.0f    ? "presence_penalty"
                      : s.frequency_penalty != 0.0f ? "frequency_penalty"
                      : s.repetition_penalty != 1.0f ? "repetition_penalty"
                      : !s.logit_bias.empty()        ? "logit_bias"
                      : s.min_p > 0.0f               ? "min_p"
                                                     : nullptr;
  if (field)
    reader.fail(bad_request(std::string(field) +
                                " is not applied by this engine; leave it at its default",
                            field));
}

std::optional<ApiError> request_logprobs(const ServerContext& ctx, int64_t top, const char* field,
                                         GenerationRequest& request) {
  if (!ctx.logprobs_supported) {
    return bad_request(std::string(field) +
                           ": logprobs are not computed by this engine",
                       field);
  }
  request.logprobs = true;
  request.params.logprobs = static_cast<int32_t>(top);
  return std::nullopt;
}

std::optional<ApiError> set_prompt(const ServerContext& ctx, std::vector<int32_t> prompt, GenerationRequest& request) {
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len == 0) return bad_request("the prompt is empty", "prompt");
  if (prompt_len >= ctx.max_model_len) {
    return bad_request("This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                           " tokens. However, your prompt has " + std::to_string(prompt_len) +
                           " tokens, leaving no room for the completion.",
                       "messages");
  }
  int64_t max_tokens = ctx.max_model_len - prompt_len;
  if (ctx.max_output_tokens > 0) max_tokens = std::min(max_tokens, ctx.max_output_tokens);
  if (request.requested_max_tokens) {
    int64_t asked = *request.requested_max_tokens;
    if (prompt_len + asked > ctx.max_model_len) {
      ApiError e =
          bad_request("This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                          " tokens. However, you requested " + std::to_string(prompt_len + asked) + " tokens (" +
                          std::to_string(prompt_len) + " in the prompt, " + std::to_string(asked) +
                          " for the completion). Please reduce the prompt or the "
                          "completion length.",
                      "max_tokens");
      e.code = "context_length_exceeded";
      return e;
    }
    if (ctx.max_output_tokens > 0 && asked > ctx.max_output_tokens) {
      return bad_request("max_tokens is " + std::to_string(asked) + " but this server allows at most " +
                             std::to_string(ctx.max_output_tokens) + " output tokens",
                         "max_tokens");
    }
    max_tokens = asked;
  }
  request.params.prompt = std::move(prompt);
  request.params.max_tokens = max_tokens;
  request.params.stop_token_ids = ctx.end_of_turn_ids;
  request.output.stop_token_ids = ctx.end_of_turn_ids;
  return std::nullopt;
}

ReasoningPrefix constrained_reasoning(const ServerContext& ctx, bool enable_thinking, int64_t budget) {
  ReasoningPrefix reasoning;
  // Only glm45 knows where reasoning ends ("</think>"), and only a grammar can hold the answer after it.
  reasoning.enabled = enable_thinking && ctx.reasoning_parser == "glm45" && ctx.structured_output;
  reasoning.max_tokens = budget;
  return reasoning;
}

std::optional<ApiError> setup_tools(const ServerContext& ctx, const nlohmann::ordered_json* tools,
                                    const nlohmann::ordered_json* tool_choice, bool parallel,
                                    const ReasoningPrefix& reasoning, ToolSetup& setup) {
  std::vector<std::string> names;
  if (tools) {
    if (!tools->is_array()) return bad_request("'tools' must be an array, got " + json_type_phrase(*tools), "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const auto& tool = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object() || string_member(tool, "type") != "function") {
        return bad_request(where + ": only tools of type \"function\" are supported", "tools");
      }
      const auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
        return bad_request(where + ".function.name is required and must be a string", "tools");
      }
      if (fn->contains("parameters") && !(*fn)["parameters"].is_object() && !(*fn)["parameters"].is_null()) {
        return bad_request(where + ".function.parameters must be an object", "tools");
      }
      names.push_back((*fn)["name"].get<std::string>());
    }
  }
  std::string mode = names.empty() ? "none" : "auto";
  std::string forced_name;
  if (tool_choice) {
    if (tool_choice->is_string()) {
      mode = tool_choice->get<std::string>();
      if (mode != "auto" && mode != "none" && mode != "required") {
        return bad_request(
            "'tool_choice' must be \"auto\", \"none\", \"required\" or a named function, got \"" + mode + "\"",
            "tool_choice");
      }
    } else if (tool_choice->is_object() && string_member(*tool_choice, "type") == "function") {
      const auto fn = tool_choice->find("function");
      if (fn != tool_choice->end() && fn->is_object() && fn->contains("name") && (*fn)["name"].is_string()) {
        forced_name = (*fn)["name"].get<std::string>();
      } else if (tool_choice->contains("name") && (*tool_choice)["name"].is_string()) {
        forced_name = (*tool_choice)["name"].get<std::string>();
      } else {
        return bad_request(
            "'tool_choice' names no function (expected {\"type\": \"function\", \"function\": "
            "{\"name\": ...}})",
            "tool_choice");
      }
      mode = "named";
    } else {
      return bad_request(
          "'tool_choice' must be a string or {\"type\": \"function\", ...}, got " + json_type_phrase(*tool_choice),
          "tool_choice");
    }
  }
  if ((mode == "required" || mode == "named") && names.empty()) {
    return bad_request("'tool_choice' is \"" + (mode == "named" ? forced_name : mode) + "\" but no tools were given",
                       "tool_choice");
  }
  if (mode == "named" && std::find(names.begin(), names.end(), forced_name) == names.end()) {
    return bad_request("'tool_choice' names the function \"" + forced_name + "\", which is not in 'tools'",
                       "tool_choice");
  }
  if (mode == "none" || names.empty()) return std::nullopt;  // tools are neither shown to the model nor parsed
  if (ctx.tool_parser.empty() && mode != "auto") {
    return bad_request(
        "this server has no tool-call parser configured, so tool_choice \"" + mode + "\" cannot be honoured",
        "tool_choice");
  }
  setup.tools = *tools;
  setup.tool_parser = ctx.tool_parser;
  if (mode != "required" && mode != "named") return std::nullopt;
  if (ctx.structured_output) {
    ToolCallGrammar grammar;
    grammar.parser = ctx.tool_parser;
    grammar.name = forced_name;
    grammar.parallel = parallel;
    grammar.reasoning = reasoning;
    auto constraint = ctx.structured_output->tool_calls(*tools, grammar);
    if (!constraint.ok())
      return bad_request("tools: the parameters of the tools cannot be enforced: " + constraint.status().message(),
                         "tools");
    setup.constraint = std::move(constraint).value();
    setup.reasoning_first = reasoning.enabled;
  }
  // After reasoning the grammar writes the call's opening itself; otherwise the prompt ends with it.
  if (!setup.reasoning_first) {
    setup.opening = forced_call_opening(ctx.tool_parser, forced_name);
    setup.forced_name = forced_name;
  }
  return std::nullopt;
}

std::optional<ApiError> build_chat_prompt(const ServerContext& ctx, const nlohmann::ordered_json& messages,
                                          const ToolSetup& tools, bool enable_thinking, bool clear_thinking,
                                          GenerationRequest& request, const nlohmann::ordered_json& template_kwargs) {
  if (!messages.is_array()) {
    return bad_request("'messages' must be an array, got " + json_type_phrase(messages), "messages");
  }
  if (messages.empty()) return bad_request("'messages' must contain at least one message", "messages");
  auto parsed = parse_chat_messages(messages);
  if (!parsed.ok()) return bad_request(parsed.status().message(), "messages");
  // A call the prompt opens starts the answer, so there is no room for reasoning before it; a grammar on the
  // answer holds from its first token unless it was built to follow reasoning.
  if (tools.constraint) {
    request.params.constraint = tools.constraint;
    request.constraint_after_reasoning = tools.reasoning_first;
  }
  const bool thinking =
      enable_thinking && tools.opening.empty() && (!request.params.constraint || request.constraint_after_reasoning);
  std::vector<ChatMedia> media;
  for (const ChatMessage& m : *parsed) media.insert(media.end(), m.media.begin(), m.media.end());
  Result<std::vector<PromptPiece>> pieces = std::vector<PromptPiece>();
  if (ctx.chat_template && media.empty()) {
    ChatRenderInput input;
    auto template_input = template_messages(messages);
    if (!template_input.ok()) return bad_request(template_input.status().message(), "messages");
    input.messages = std::move(template_input).value();
    if (!tools.tools.empty()) input.tools = tools.tools;
    input.kwargs = template_kwargs;
    if (!thinking) input.kwargs["enable_thinking"] = false;
    pieces = ctx.chat_template->render_pieces(input, ctx.special_token_texts);
    if (!pieces.ok()) {
      return bad_request("the model's chat template refused these messages: " + pieces.status().message(),
                         "messages");
    }
  } else {
    ChatTemplateOptions options;
    options.enable_thinking = thinking;
    options.clear_thinking = clear_thinking;
    options.tools = tools.tools;
    pieces = render_glm_chat_pieces(*parsed, options);
    if (!pieces.ok()) return bad_request(pieces.status().message(), "messages");
  }
  request.prefill.clear();
  for (const PromptPiece& piece : tools.opening) {
    pieces->push_back(piece);
    request.prefill += piece.text;
  }
  request.output.split_reasoning = ctx.reasoning_parser == "glm45";
  request.output.starts_in_reasoning = thinking;
  request.output.tool_parser = tools.tool_parser;
  request.output.forced_tool_name = tools.forced_name;
  request.output.tools = tools.tools;
  if (media.empty()) return set_prompt(ctx, ctx.tokenizer->encode(*pieces), request);
  if (!ctx.media) return bad_request(media.front().field + ": this server takes no media", media.front().field);
  std::vector<int32_t> prompt;
  std::vector<RequestMedia> spans;
  if (auto e = ctx.media->build_prompt(*ctx.tokenizer, *pieces, media, prompt, spans)) return e;
  if (auto e = set_prompt(ctx, std::move(prompt), request)) return e;
  request.params.media = std::move(spans);
  return std::nullopt;
}

}  // namespace kiln
