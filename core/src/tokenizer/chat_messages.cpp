// parse_chat_messages (declared in chat_template.h): OpenAI request messages → ChatMessage.
#include "tokenizer/bounded_json.h"
#include "tokenizer/chat_template.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

// The text of a content value; image parts (user messages only) go to `media`, numbered from `next_media` on.
Result<std::string> text_of(const Json& content, const std::string& field, std::vector<ChatMedia>* media,
                            int32_t& next_media) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return invalid_argument(field + ": expected a string, null or an array of parts");
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string where = field + "[" + std::to_string(i) + "]";
    if (part.is_string()) {
      text += part.get<std::string>();
      continue;
    }
    if (part.is_object() && part.contains("type") && part["type"] == "image_url") {
      if (!media) return invalid_argument(where + ": image parts are accepted in user messages only");
      const Json* url = part.contains("image_url") ? &part["image_url"] : nullptr;
      if (url && url->is_object()) url = url->contains("url") ? &(*url)["url"] : nullptr;
      if (!url || !url->is_string()) return invalid_argument(where + ".image_url.url: expected a string");
      media->push_back({text.size(), next_media++, url->get<std::string>(), where});
      continue;
    }
    if (!part.is_object() || !part.contains("type") || part["type"] != "text") {
      return invalid_argument(where + ": only {\"type\": \"text\"} and {\"type\": \"image_url\"} parts are supported");
    }
    if (!part.contains("text") || !part["text"].is_string())
      return invalid_argument(where + ".text: expected a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

Result<std::string> optional_string(const Json& message, const char* key, const std::string& field) {
  if (!message.contains(key) || message[key].is_null()) return std::string();
  if (!message[key].is_string()) return invalid_argument(field + "." + key + ": expected a string");
  return message[key].get<std::string>();
}

Result<ToolCall> parse_tool_call(const Json& json, const std::string& field) {
  if (!json.is_object()) return invalid_argument(field + ": expected an object");
  ToolCall call;
  KILN_ASSIGN_OR_RETURN(call.id, optional_string(json, "id", field));
  if (!json.contains("function") || !json["function"].is_object()) {
    return invalid_argument(field + ".function: missing or not an object");
  }
  const Json& function = json["function"];
  if (!function.contains("name") || !function["name"].is_string()) {
    return invalid_argument(field + ".function.name: missing or not a string");
  }
  call.name = function["name"].get<std::string>();
  const Json arguments = function.contains("arguments") ? function["arguments"] : Json::object();
  if (arguments.is_string()) {
    const std::string& text = arguments.get_ref<const std::string&>();
    std::string error;
    if (text.empty()) {
      call.arguments = Json::object();
    } else if (!parse_bounded_json(text, call.arguments, error)) {
      return invalid_argument(field + ".function.arguments: not valid JSON: " + error);
    }
  } else if (arguments.is_object()) {
    call.arguments = arguments;
  } else if (!arguments.is_null()) {
    return invalid_argument(field + ".function.arguments: expected a JSON string or an object");
  } else {
    call.arguments = Json::object();
  }
  if (!call.arguments.is_object()) {
    return invalid_argument(field + ".function.arguments: expected a JSON object, got " + call.arguments.dump());
  }
  return call;
}

}  // namespace

Result<std::vector<ChatMessage>> parse_chat_messages(const Json& openai_messages) {
  if (!openai_messages.is_array()) return invalid_argument("messages: expected an array");
  std::vector<ChatMessage> messages;
  messages.reserve(openai_messages.size());
  int32_t next_media = 0;
  for (std::size_t i = 0; i < openai_messages.size(); ++i) {
    const std::string field = "messages[" + std::to_string(i) + "]";
    const Json& json = openai_messages[i];
    if (!json.is_object()) return invalid_argument(field + ": expected an object");
    if (!json.contains("role") || !json["role"].is_string())
      return invalid_argument(field + ".role: missing or not a string");
    ChatMessage m;
    m.role = json["role"].get<std::string>();
    if (m.role == "developer") m.role = "system";
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return invalid_argument(field + ".role: '" + m.role + "' is not one of system, developer, user, assistant, tool");
    }
    // As OpenAI's API: content is required (a string or parts, not null) except on an assistant message that
    // carries tool calls; a tool result names the call it answers.
    const bool has_calls = json.contains("tool_calls") && json["tool_calls"].is_array() && !json["tool_calls"].empty();
    const bool has_content = json.contains("content") && !json["content"].is_null();
    if (!has_content && m.role != "assistant")
      return invalid_argument(field + ".content: a " + m.role + " message needs content (a string or an array of parts)");
    if (!has_content && !has_calls)
      return invalid_argument(field + ".content: an assistant message needs content unless it carries tool_calls");
    KILN_ASSIGN_OR_RETURN(m.content, text_of(json.contains("content") ? json["content"] : Json(), field + ".content",
                                             m.role == "user" ? &m.media : nullptr, next_media));
    KILN_ASSIGN_OR_RETURN(m.reasoning_content, optional_string(json, "reasoning_content", field));
    KILN_ASSIGN_OR_RETURN(m.tool_call_id, optional_string(json, "tool_call_id", field));
    if (m.role == "tool" && m.tool_call_id.empty())
      return invalid_argument(field + ".tool_call_id: a tool message names the call it answers (a non-empty string)");
    KILN_ASSIGN_OR_RETURN(m.name, optional_string(json, "name", field));
    if (json.contains("tool_calls") && !json["tool_calls"].is_null()) {
      const Json& calls = json["tool_calls"];
      if (!calls.is_array()) return invalid_argument(field + ".tool_calls: expected an array");
      if (m.role != "assistant" && !calls.empty()) {
        return invalid_argument(field + ".tool_calls: only assistant messages carry tool calls");
      }
      for (std::size_t c = 0; c < calls.size(); ++c) {
        KILN_ASSIGN_OR_RETURN(ToolCall call,
                              parse_tool_call(calls[c], field + ".tool_calls[" + std::to_string(c) + "]"));
        m.tool_calls.push_back(std::move(call));
      }
    }
    messages.push_back(std::move(m));
  }
  return messages;
}

}  // namespace kiln
