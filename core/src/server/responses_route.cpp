#include "server/responses_route.h"

#include <chrono>

#include "server/response_format.h"

namespace kiln {
namespace {

using ojson = nlohmann::ordered_json;

bool is_blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// Builds the output items from pieces in order, and the stream events that describe each step. Streamed and
// non-streamed responses both go through it, so the final `output` is the same either way.
class OutputItems {
 public:
  // Events for these pieces (empty JSON list when not streaming is fine: callers may ignore them).
  std::vector<ojson> add(const OutputPieces& pieces) {
    std::vector<ojson> events;
    for (const auto& p : pieces) {
      switch (p.kind) {
        case OutputPiece::Kind::kReasoning:
          if (open_kind_ != "reasoning") {
            close(events);
            open(events,
                 {{"type", "reasoning"},
                  {"id", random_id("rs_")},
                  {"summary", ojson::array()},
                  {"content", ojson::array()},
                  {"status", "in_progress"}},
                 "reasoning");
          }
          text_ += p.text;
          events.push_back({{"type", "response.reasoning_text.delta"},
                            {"item_id", items_[open_]["id"]},
                            {"output_index", open_},
                            {"content_index", 0},
                            {"delta", p.text}});
          break;
        case OutputPiece::Kind::kContent:
          if (open_kind_ != "message") {
            // Whitespace between reasoning and a tool call is not worth a message item.
            held_space_ += p.text;
            if (is_blank(held_space_)) break;
            close(events);
            open(events,
                 {{"type", "message"},
                  {"id", random_id("msg_")},
                  {"status", "in_progress"},
                  {"role", "assistant"},
                  {"content", ojson::array()}},
                 "message");
            events.push_back({{"type", "response.content_part.added"},
                              {"item_id", items_[open_]["id"]},
                              {"output_index", open_},
                              {"content_index", 0},
                              {"part", text_part("")}});
            emit_text(events, held_space_);
            held_space_.clear();
            break;
          }
          emit_text(events, p.text);
          break;
        case OutputPiece::Kind::kToolCallStart:
          close(events);
          held_space_.clear();
          open(events,
               {{"type", "function_call"},
                {"id", random_id("fc_")},
                {"call_id", p.tool_id},
                {"name", p.tool_name},
                {"arguments", ""},
                {"status", "in_progress"}},
               "function_call");
          break;
        case OutputPiece::Kind::kToolCallArguments:
          if (open_kind_ != "function_call") break;
          text_ += p.text;
          events.push_back({{"type", "response.function_call_arguments.delta"},
                            {"item_id", items_[open_]["id"]},
                            {"output_index", open_},
                            {"delta", p.text}});
          break;
      }
    }
    return events;
  }

  std::vector<ojson> finish() {
    std::vector<ojson> events;
    close(events);
    return events;
  }

  const ojson& items() const { return items_; }

 private:
  static ojson text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
  }

  void emit_text(std::vector<ojson>& events, const std::string& text) {
    if (text.empty()) return;
    text_ += text;
    events.push_back({{"type", "response.output_text.delta"},
                      {"item_id", items_[open_]["id"]},
                      {"output_index", open_},
                      {"content_index", 0},
                      {"delta", text},
                      {"logprobs", ojson::array()}});
  }

  void open(std::vector<ojson>& events, ojson item, const std::string& kind) {
    items_.push_back(std::move(item));
    open_ = static_cast<int>(items_.size()) - 1;
    open_kind_ = kind;
    text_.clear();
    events.push_back({{"type", "response.output_item.added"}, {"output_index", open_}, {"item", items_[open_]}});
  }

  void close(std::vector<ojson>& events) {
    if (open_ < 0) return;
    ojson& item = items_[open_];
    const ojson id = item["id"];
    if (open_kind_ == "reasoning") {
      item["content"] = ojson::array({{{"type", "reasoning_text"}, {"text", text_}}});
      events.push_back({{"type", "response.reasoning_text.done"},
                        {"item_id", id},
                        {"output_index", open_},
                        {"content_index", 0},
                        {"text", text_}});
    } else if (open_kind_ == "message") {
      item["content"] = ojson::array({text_part(text_)});
      events.push_back({{"type", "response.output_text.done"},
                        {"item_id", id},
                        {"output_index", open_},
                        {"content_index", 0},
                        {"text", text_},
                        {"logprobs", ojson::array()}});
      events.push_back({{"type", "response.content_part.done"},
                        {"item_id", id},
                        {"output_index", open_},
                        {"content_index", 0},
                        {"part", text_part(text_)}});
    } else {
      item["arguments"] = text_;
      events.push_back({{"type", "response.function_call_arguments.done"},
                        {"item_id", id},
                        {"output_index", open_},
                        {"name", item["name"]},
                        {"arguments", text_}});
    }
    item["status"] = "completed";
    events.push_back({{"type", "response.output_item.done"}, {"output_index", open_}, {"item", item}});
    open_ = -1;
    open_kind_.clear();
    text_.clear();
  }

  ojson items_ = ojson::array();
  int open_ = -1;
  std::string open_kind_;
  std::string text_;        // the open item's text so far
  std::string held_space_;  // leading whitespace of a message not yet opened
};

class ResponsesWriter : public ResponseWriter {
 public:
  ResponsesWriter(std::string model, ojson echo) : model_(std::move(model)), echo_(std::move(echo)) {
    id_ = random_id("resp_");
    created_ =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  std::string stream_begin() override {
    ojson response = base("in_progress");
    std::string out = event({{"type", "response.created"}, {"response", response}});
    return out + event({{"type", "response.in_progress"}, {"response", response}});
  }

  std::string stream_pieces(const OutputPieces& pieces) override { return events(items_.add(pieces)); }

  std::string stream_end(const GenerationResult& result) override {
    std::string out = events(items_.finish());
    ojson response = final_response(result);
    const std::string type = response["status"] == "incomplete" ? "response.incomplete" : "response.completed";
    return out + event({{"type", type}, {"response", response}});
  }

  std::string stream_error(const ApiError& error) override {
    return event({{"type", "error"},
                  {"code", error.code.empty() ? ojson(nullptr) : ojson(error.code)},
                  {"message", error.message},
                  {"param", error.param.empty() ? ojson(nullptr) : ojson(error.param)}});
  }

  ojson complete(const OutputPieces& pieces, const GenerationResult& result) override {
    items_.add(pieces);
    items_.finish();
    return final_response(result);
  }

 private:
  ojson base(const std::string& status) const {
    ojson r = {{"id", id_},
               {"object", "response"},
               {"created_at", created_},
               {"status", status},
               {"model", model_},
               {"output", ojson::array()},
               {"error", nullptr},
               {"incomplete_details", nullptr},
               {"parallel_tool_calls", true},
               {"previous_response_id", nullptr},
               {"store", false},
               {"text", {{"format", {{"type", "text"}}}}},
               {"truncation", "disabled"},
               {"metadata", ojson::object()},
               {"usage", nullptr}};
    for (const auto& [key, value] : echo_.items()) r[key] = value;
    return r;
  }

  ojson final_response(const GenerationResult& result) const {
    const bool cut = result.finish_reason == "length";
    ojson r = base(cut ? "incomplete" : "completed");
    if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    r["output"] = items_.items();
    r["usage"] = {{"input_tokens", result.usage.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", result.usage.cached_tokens}}},
                  {"output_tokens", result.usage.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", result.usage.prompt_tokens + result.usage.completion_tokens}};
    return r;
  }

  std::string event(ojson e) {
    e["sequence_number"] = sequence_++;
    return sse_event(e, e["type"].get<std::string>());
  }

  std::string events(const std::vector<ojson>& list) {
    std::string out;
    for (const auto& e : list) out += event(e);
    return out;
  }

  std::string id_, model_;
  int64_t created_ = 0;
  ojson echo_;
  OutputItems items_;
  int64_t sequence_ = 0;
};

// Text of a content value: a string, or parts of type input_text / output_text / text.
std::optional<ApiError> content_text(const ojson& content, const std::string& where, std::string& text) {
  if (content.is_string()) {
    text = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return bad_request(where + " must be a string or a list of content parts", "input");
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const std::string type = part.is_object() ? string_member(part, "type").value_or("") : "";
    if ((type != "input_text" && type != "output_text" && type != "text") || !part.contains("text") ||
        !part["text"].is_string()) {
      return bad_request(where + "[" + std::to_string(i) + "]: only text parts (input_text, output_text) are supported",
                         "input");
    }
    text += part["text"].get<std::string>();
  }
  return std::nullopt;
}

// A user message's content with input_image parts, as chat-format parts (text parts and image_url parts) in order.
std::optional<ApiError> content_with_images(const ojson& content, const std::string& where, ojson& parts) {
  parts = ojson::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    const std::string type = part.is_object() ? string_member(part, "type").value_or("") : "";
    if (type == "input_image") {
      if (!part.contains("image_url") || !part["image_url"].is_string())
        return bad_request(at + ".image_url: expected a data: URL string (file ids are not supported)", "input");
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", part["image_url"]}}}});
      continue;
    }
    std::string text;
    if (auto e = content_text(ojson::array({part}), at, text)) return e;
    parts.push_back({{"type", "text"}, {"text", text}});
  }
  return std::nullopt;
}

bool has_input_image(const ojson& content) {
  if (!content.is_array()) return false;
  for (const auto& part : content)
    if (part.is_object() && string_member(part, "type").value_or("") == "input_image") return true;
  return false;
}

// Responses input items → OpenAI chat messages (what the chat template reads).
std::optional<ApiError> input_to_messages(const ojson& input, ojson& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return bad_request("'input' must be a string or a list of items", "input");
  std::string pending_reasoning;
  auto last_assistant = [&]() -> ojson* {
    if (!messages.empty() && messages.back()["role"] == "assistant") return &messages.back();
    messages.push_back({{"role", "assistant"}, {"content", ""}});
    return &messages.back();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const auto& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return bad_request(where + " must be an object", "input");
    const auto type_member = string_member(item, "type", item.contains("role") ? "message" : "");
    if (!type_member) return bad_request(where + ".type must be a string", "input");
    const std::string& type = *type_member;
    if (type == "message") {
      const std::string role = string_member(item, "role").value_or("");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        return bad_request(where + ".role must be user, system, developer or assistant", "input");
      }
      const ojson content = item.contains("content") ? item["content"] : ojson("");
      ojson message = {{"role", role}};
      if (role == "user" && has_input_image(content)) {
        if (auto e = content_with_images(content, where + ".content", message["content"])) return e;
      } else {
        std::string text;
        if (auto e = content_text(content, where + ".content", text)) return e;
        message["content"] = text;
      }
      if (role == "assistant" && !pending_reasoning.empty()) {
        message["reasoning_content"] = pending_reasoning;
        pending_reasoning.clear();
      }
      messages.push_back(std::move(message));
    } else if (type == "function_call") {
      if (!item.contains("name") || !item["name"].is_string() || !item.contains("call_id") ||
          !item["call_id"].is_string()) {
        return bad_request(where + ": a function_call needs string 'name' and 'call_id'", "input");
      }
      const auto arguments = string_member(item, "arguments", "{}");
      if (!arguments) return bad_request(where + ".arguments must be a JSON string", "input");
      ojson* assistant = last_assistant();
      if (!pending_reasoning.empty()) {
        (*assistant)["reasoning_content"] = pending_reasoning;
        pending_reasoning.clear();
      }
      if (!assistant->contains("tool_calls")) (*assistant)["tool_calls"] = ojson::array();
      (*assistant)["tool_calls"].push_back(
          {{"id", item["call_id"]},
           {"type", "function"},
           {"function", {{"name", item["name"]}, {"arguments", *arguments}}}});
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string() || item["call_id"].get_ref<const std::string&>().empty()) {
        return bad_request(where + ": a function_call_output needs a non-empty string 'call_id'", "input");
      }
      std::string text;
      if (auto e = content_text(item.contains("output") ? item["output"] : ojson(""), where + ".output", text)) {
        return e;
      }
      messages.push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", text}});
    } else if (type == "reasoning") {
      for (const char* field : {"content", "summary"}) {
        if (!item.contains(field) || !item[field].is_array()) continue;
        for (const auto& part : item[field]) {
          if (part.is_object() && part.contains("text") && part["text"].is_string()) {
            pending_reasoning += part["text"].get<std::string>();
          }
        }
        if (!pending_reasoning.empty()) break;
      }
    } else {
      return bad_request(where + ": unsupported item type \"" + type + "\"", "input");
    }
  }
  return std::nullopt;
}

// Responses tools are flat ({type, name, description, parameters}); the template and parser read chat tools.
std::optional<ApiError> tools_to_chat(const ojson& tools, ojson& chat_tools) {
  if (!tools.is_array()) return bad_request("'tools' must be an array", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& tool = tools[i];
    if (!tool.is_object() || string_member(tool, "type") != "function") {
      return bad_request("tools[" + std::to_string(i) + "]: only tools of type \"function\" are supported", "tools");
    }
    ojson fn = ojson::object();
    for (const char* key : {"name", "description", "parameters"}) {
      if (tool.contains(key) && !tool[key].is_null()) fn[key] = tool[key];
    }
    chat_tools.push_back({{"type", "function"}, {"function", fn}});
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> prepare_response(const ServerContext& ctx, const ojson& body, PreparedGeneration& out) {
  RequestReader reader(body);
  if (auto e = check_model(ctx, reader)) return e;
  GenerationRequest& request = out.request;
  read_sampling_fields(reader, {"max_output_tokens"}, request);
  if (request.n != 1)
    reader.fail(bad_request("a response has one output: n is not a /v1/responses field (use /v1/chat/completions)", "n"));
  if (auto logprobs = reader.boolean("logprobs"); logprobs && *logprobs) {
    reader.fail(bad_request("logprobs are not supported on /v1/responses (use /v1/chat/completions)", "logprobs"));
  }
  if (reader.value("top_logprobs")) {
    reader.fail(bad_request("top_logprobs is not supported on /v1/responses (use /v1/chat/completions)",
                            "top_logprobs"));
  }
  auto instructions = reader.string("instructions");
  bool enable_thinking = true;
  if (const auto* reasoning = reader.value("reasoning")) {
    if (!reasoning->is_object()) {
      reader.fail(bad_request("'reasoning' must be an object", "reasoning"));
    } else if (reasoning->contains("effort") && (*reasoning)["effort"].is_string()) {
      const std::string effort = (*reasoning)["effort"].get<std::string>();
      enable_thinking = effort != "none" && effort != "minimal";
    }
  }
  if (reader.value("previous_response_id")) {
    reader.fail(
        bad_request("previous_response_id is not supported: responses are not stored; send the whole "
                    "conversation in 'input'",
                    "previous_response_id"));
  }
  if (const auto* text = reader.value("text"); text && !text->is_object())
    reader.fail(bad_request("'text' must be an object, got " + json_type_phrase(*text), "text"));
  if (!reader.ok()) return reader.error();
  if (const auto* text = reader.value("text"); text && text->contains("format")) {
    if (auto e = read_response_format(ctx, (*text)["format"], "text.format", /*nested=*/false,
                                      constrained_reasoning(ctx, enable_thinking), request))
      return e;
  }
  const ojson* input = reader.value("input");
  if (!input) return bad_request("'input' is required", "input");

  ojson messages = ojson::array();
  if (instructions) messages.push_back({{"role", "system"}, {"content", *instructions}});
  if (auto e = input_to_messages(*input, messages)) return e;
  ojson chat_tools = ojson::array();
  const ojson* tools = reader.value("tools");
  if (tools) {
    if (auto e = tools_to_chat(*tools, chat_tools)) return e;
  }
  ToolSetup setup;
  const bool parallel_tool_calls = reader.boolean("parallel_tool_calls").value_or(true);
  if (!reader.ok()) return reader.error();
  if (auto e = setup_tools(ctx, tools ? &chat_tools : nullptr, reader.value("tool_choice"), parallel_tool_calls,
                           constrained_reasoning(ctx, enable_thinking), setup))
    return e;
  if (setup.constraint && request.params.constraint)
    return bad_request("text.format asks for JSON but tool_choice forces a tool call; ask for one of them",
                       "text.format");
  if (auto e = build_chat_prompt(ctx, messages, setup, enable_thinking, true, request)) {
    if (e->param == "messages") e->param = "input";
    return e;
  }
  ojson echo = {
      {"instructions", instructions ? ojson(*instructions) : ojson(nullptr)},
      {"max_output_tokens", request.requested_max_tokens ? ojson(*request.requested_max_tokens) : ojson(nullptr)},
      {"temperature", request.params.sampling.temperature},
      {"top_p", request.params.sampling.top_p},
      {"tools", tools ? *tools : ojson::array()},
      {"tool_choice", reader.value("tool_choice") ? *reader.value("tool_choice") : ojson("auto")},
      {"parallel_tool_calls", parallel_tool_calls},
      {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}}};
  if (const auto* text = reader.value("text"); text && text->contains("format") && !(*text)["format"].is_null())
    echo["text"] = {{"format", (*text)["format"]}};
  out.writer = std::make_unique<ResponsesWriter>(ctx.served_name, std::move(echo));
  return std::nullopt;
}

}  // namespace kiln
