#include "server/chat_completions_route.h"

#include <chrono>

#include "server/logprobs_json.h"
#include "server/response_format.h"

namespace kiln {
namespace {

using ojson = nlohmann::ordered_json;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class ChatWriter : public ResponseWriter {
 public:
  ChatWriter(std::string model, bool include_usage, const Tokenizer* logprobs_tokenizer)
      : id_(random_id("chatcmpl-")),
        model_(std::move(model)),
        created_(unix_now()),
        include_usage_(include_usage),
        logprobs_(logprobs_tokenizer) {}

  std::string stream_begin() override { return chunk({{"role", "assistant"}, {"content", ""}}, nullptr); }

  std::string stream_pieces(const OutputPieces& pieces) override {
    std::string out;
    for (const auto& p : pieces) {
      switch (p.kind) {
        case OutputPiece::Kind::kReasoning:
          out += chunk({{"reasoning_content", p.text}}, nullptr);
          break;
        case OutputPiece::Kind::kContent:
          out += chunk({{"content", p.text}}, nullptr);
          break;
        case OutputPiece::Kind::kToolCallStart:
          out += chunk({{"tool_calls", ojson::array({{{"index", p.tool_index},
                                                      {"id", p.tool_id},
                                                      {"type", "function"},
                                                      {"function", {{"name", p.tool_name}, {"arguments", ""}}}}})}},
                       nullptr);
          break;
        case OutputPiece::Kind::kToolCallArguments:
          out +=
              chunk({{"tool_calls", ojson::array({{{"index", p.tool_index}, {"function", {{"arguments", p.text}}}}})}},
                    nullptr);
          break;
      }
    }
    return out;
  }

  std::string stream_end(const GenerationResult& result) override {
    return stream_finish(result) + stream_close(result.usage);
  }
  std::string stream_finish(const GenerationResult& result) override {
    return chunk(ojson::object(), openai_finish_reason(result));
  }
  std::string stream_close(const Usage& usage) override {
    std::string out;
    if (include_usage_) {
      ojson last = header();
      last["choices"] = ojson::array();
      last["usage"] = usage_json(usage);
      out += sse_event(last);
    }
    return out + "data: [DONE]\n\n";
  }

  std::unique_ptr<ResponseWriter> for_choice(int index) const override {
    auto w = std::make_unique<ChatWriter>(*this);
    w->index_ = index;
    w->pending_logprobs_.clear();
    return w;
  }

  std::string stream_error(const ApiError& error) override { return sse_event(error.to_json()) + "data: [DONE]\n\n"; }

  ojson complete(const OutputPieces& pieces, const GenerationResult& result) override {
    std::string content, reasoning;
    for (const auto& p : pieces) {
      if (p.kind == OutputPiece::Kind::kContent) content += p.text;
      if (p.kind == OutputPiece::Kind::kReasoning) reasoning += p.text;
    }
    ojson message = {{"role", "assistant"}};
    message["content"] = content.empty() && !result.tool_calls.empty() ? ojson(nullptr) : ojson(content);
    if (!reasoning.empty()) message["reasoning_content"] = reasoning;
    if (!result.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const auto& call : result.tool_calls) {
        calls.push_back({{"id", call.id},
                         {"type", "function"},
                         {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      }
      message["tool_calls"] = calls;
    }
    ojson body = {{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", model_}};
    body["choices"] = ojson::array({{{"index", index_},
                                     {"message", message},
                                     {"logprobs", take_logprobs()},
                                     {"finish_reason", openai_finish_reason(result)}}});
    body["usage"] = usage_json(result.usage);
    return body;
  }

 private:
  ojson header() const {
    return {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_}};
  }

  // The logprobs received since the last chunk (null when the request did not ask, or there are none).
  ojson take_logprobs() {
    if (!logprobs_ || pending_logprobs_.empty()) return logprobs_ ? chat_logprobs_json(*logprobs_, {}) : nullptr;
    ojson out = chat_logprobs_json(*logprobs_, pending_logprobs_);
    pending_logprobs_.clear();
    return out;
  }

  std::string chunk(ojson delta, ojson finish_reason) {
    ojson c = header();
    c["choices"] = ojson::array({{{"index", index_},
                                  {"delta", std::move(delta)},
                                  {"logprobs", logprobs_ && !pending_logprobs_.empty() ? take_logprobs() : ojson(nullptr)},
                                  {"finish_reason", std::move(finish_reason)}}});
    if (include_usage_) c["usage"] = nullptr;
    return sse_event(c);
  }

  std::string id_, model_;
  int64_t created_;
  bool include_usage_;
  const Tokenizer* logprobs_;  // set when the request asked for logprobs
  int index_ = 0;              // the choice this writer writes
};

}  // namespace

std::optional<ApiError> prepare_chat_completion(const ServerContext& ctx, const ojson& body, PreparedGeneration& out) {
  RequestReader reader(body);
  if (auto e = check_model(ctx, reader)) return e;
  GenerationRequest& request = out.request;
  read_sampling_fields(reader, {"max_completion_tokens", "max_tokens"}, request);
  read_penalty_fields(ctx, reader, request);
  bool enable_thinking = true, clear_thinking = true;
  ojson template_kwargs = ojson::object();
  if (const auto* kwargs = reader.value("chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      reader.fail(bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs"));
    } else {
      template_kwargs = *kwargs;
      RequestReader kw(*kwargs);
      enable_thinking = kw.boolean("enable_thinking").value_or(true);
      clear_thinking = kw.boolean("clear_thinking").value_or(true);
      if (!kw.ok()) reader.fail(bad_request(kw.error().message, "chat_template_kwargs." + kw.error().param));
      // The template's own variables cannot be overridden (transformers would fail with a TypeError).
      for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
        if (kwargs->contains(reserved)) {
          reader.fail(bad_request(std::string("chat_template_kwargs.") + reserved +
                                      " is set by the server, not by the request",
                                  std::string("chat_template_kwargs.") + reserved));
        }
      }
    }
  }
  const bool parallel_tool_calls = reader.boolean("parallel_tool_calls").value_or(true);
  // vLLM's name: how many tokens the reasoning before a constrained answer may take before "</think>" is forced.
  const auto thinking_token_budget = reader.integer("thinking_token_budget", 0, INT32_MAX);
  const bool logprobs = reader.boolean("logprobs").value_or(false);
  const auto top_logprobs = reader.integer("top_logprobs", 0, kMaxTopLogprobs);
  if (top_logprobs && !logprobs)
    reader.fail(bad_request("'top_logprobs' needs \"logprobs\": true", "top_logprobs"));
  if (!reader.ok()) return reader.error();
  if (logprobs) {
    if (auto e = request_logprobs(ctx, top_logprobs.value_or(0), "logprobs", request)) return e;
  }
  const ojson* messages = reader.value("messages");
  if (!messages) return bad_request("'messages' is required", "messages");

  const ReasoningPrefix reasoning = constrained_reasoning(ctx, enable_thinking, thinking_token_budget.value_or(-1));
  if (const auto* format = reader.value("response_format")) {
    if (auto e = read_response_format(ctx, *format, "response_format", /*nested=*/true, reasoning, request)) return e;
  }
  ToolSetup tools;
  if (auto e =
          setup_tools(ctx, reader.value("tools"), reader.value("tool_choice"), parallel_tool_calls, reasoning, tools))
    return e;
  if (tools.constraint && request.params.constraint)
    return bad_request("response_format asks for JSON content but tool_choice forces a tool call; ask for one of them",
                       "response_format");
  // The budget is enforced by the grammar of a constrained answer; anywhere else it would be silently ignored.
  if (thinking_token_budget && !request.constraint_after_reasoning && !tools.reasoning_first)
    return bad_request(
        "'thinking_token_budget' bounds the reasoning before a constrained answer (a JSON response_format or a "
        "forced tool_choice, with thinking on and a reasoning parser); this request has none",
        "thinking_token_budget");
  if (auto e = build_chat_prompt(ctx, *messages, tools, enable_thinking, clear_thinking, request, template_kwargs))
    return e;
  out.writer =
      std::make_unique<ChatWriter>(ctx.served_name, request.include_usage, request.logprobs ? ctx.tokenizer : nullptr);
  return std::nullopt;
}

}  // namespace kiln
