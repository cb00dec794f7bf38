// GLM-4.7's chat template (zai-org/GLM-4.7 chat_template.jinja, as rendered by transformers with
// trim_blocks/lstrip_blocks), reproduced in C++ as a faster cache of that one template: checkpoints ship their own
// template, which jinja_chat_template.h renders; the server uses this only when the checkpoint's template is exactly
// GLM-4.7's (tests prove the two identical), when it has none, and for requests with image parts.
// GLM-4.7-Flash ships the same template.
//
//   [gMASK]<sop>
//   tools present  <|system|>\n# Tools\n\nYou may call ... <tools>\n{tool JSON}\n...</tools>\n\nFor each function
//                  call, output ... <tool_call>{function-name}<arg_key>...</tool_call>     (no newline after)
//   system         <|system|>{content}
//   user           <|user|>{content}
//   assistant      <|assistant|> then <think>{reasoning.strip()}</think> when the turn comes after the last user
//                  message (or clear_thinking is false) and has reasoning, else </think>; then content.strip();
//                  then <tool_call>{name}<arg_key>{k}</arg_key><arg_value>{v}</arg_value>...</tool_call> per call
//                  (string values raw, others as JSON). Without reasoning_content, reasoning is taken from a
//                  "<think>…</think>" prefix of the content.
//   tool           <|observation|> (only when the previous message is not a tool message)
//                  <tool_response>{content}</tool_response>
//   generation     <|assistant|><think>, or <|assistant|></think> with thinking disabled
//
// Tool JSON is written as Python's json.dumps(ensure_ascii=False) would, keys in the order given, so the tools
// and arguments are nlohmann::ordered_json (a plain nlohmann::json converts to it, with its keys sorted).
// Known differences from the Jinja original, all for inputs OpenAI clients do not send: content given as a
// list is flattened to its text parts for every role (Jinja would print a tool message's list as Python
// reprs), null content is "" (Jinja prints "None"), and an empty reasoning_content counts as absent.
// GLM-5.x templates differ in details (e.g. per-tool filtering, "<think></think>" for cleared history); this
// file reproduces GLM-4.7.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct ToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // an object: name → value
};

// An image part of a user message: where it sits in the message's text, its number among the request's media
// (in order), and its URL as the client sent it (the server decodes it).
struct ChatMedia {
  std::size_t offset = 0;  // bytes of `content` before it
  int32_t index = 0;
  std::string url;
  std::string field;  // "messages[1].content[2]", for errors
};

struct ChatMessage {
  std::string role;  // system, user, assistant, tool
  std::string content;
  std::vector<ChatMedia> media;  // user messages only, by offset
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;
  std::string name;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  // false keeps every earlier assistant turn's reasoning (GLM's "preserved thinking"); true (the template's
  // default) keeps only the reasoning of turns after the last user message.
  bool clear_thinking = true;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // OpenAI tools, rendered as given
};

// The prompt as pieces: the template's markup, and the text the messages and tools brought (client text, in
// which the tokenizer matches no special token). Fails on an unknown role or on tool-call arguments that are not
// a JSON object, naming "messages[i]...".
Result<std::vector<PromptPiece>> render_glm_chat_pieces(const std::vector<ChatMessage>& messages,
                                                        const ChatTemplateOptions& options);
// GLM-4.7's chat_template.jinja. A checkpoint whose template is exactly this text is rendered by the functions
// above instead of by Jinja (faster; tests/tokenizer/jinja_chat_template_test.cpp proves the output identical).
const std::string& glm47_chat_template_source();

// The same prompt as one string.
Result<std::string> render_glm_chat(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options);

// Reads OpenAI chat messages: content as a string, null, or an array of {"type": "text", "text": ...} parts (and in
// user messages {"type": "image_url", "image_url": {"url": ...}} parts, numbered in order over the request);
// assistant tool_calls with function.arguments as a JSON string (or an object); tool_call_id and name.
// Roles: system, developer (read as system), user, assistant, tool. Errors name the field ("messages[2].role").
Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::ordered_json& openai_messages);

}  // namespace kiln
