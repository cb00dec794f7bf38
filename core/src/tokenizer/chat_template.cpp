#include "tokenizer/chat_template.h"

#include <string_view>

#include "tokenizer/python_json.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

constexpr std::string_view kToolsPreamble =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
constexpr std::string_view kToolsPostamble =
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";

// Python's str.isspace, which str.strip() uses.
bool is_python_space(char32_t c) {
  return utf8::is_unicode_whitespace(c) || (c >= 0x1C && c <= 0x1F);
}

std::string_view python_strip(std::string_view s) {
  std::size_t begin = 0;
  while (begin < s.size()) {
    std::size_t length = 1;
    if (!is_python_space(utf8::decode_at(s, begin, length))) break;
    begin += length;
  }
  std::size_t end = s.size();
  while (end > begin) {
    std::size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    std::size_t length = 1;
    if (!is_python_space(utf8::decode_at(s, start, length))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

std::string_view strip_newlines_left(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

std::string_view strip_newlines_right(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Appends to the prompt, merging runs of the same kind.
class PromptBuilder {
 public:
  void markup(std::string_view text) { append(text, false); }
  void client(std::string_view text) { append(text, true); }
  void media(int32_t index) { pieces_.push_back({"", false, index}); }
  std::vector<PromptPiece> take() { return std::move(pieces_); }

 private:
  void append(std::string_view text, bool client_text) {
    if (text.empty()) return;
    if (pieces_.empty() || pieces_.back().client_text != client_text || pieces_.back().media >= 0)
      pieces_.push_back({"", client_text});
    pieces_.back().text += text;
  }
  std::vector<PromptPiece> pieces_;
};

// Without reasoning_content, the template reads "…<think>R</think>C" out of the content.
void split_reasoning(const ChatMessage& m, std::string& reasoning, std::string& content) {
  content = m.content;
  reasoning = m.reasoning_content;
  if (!reasoning.empty()) return;
  const std::size_t close = content.find("</think>");
  if (close == std::string::npos) return;
  std::string_view before = strip_newlines_right(std::string_view(content).substr(0, close));
  const std::size_t open = before.rfind("<think>");
  if (open != std::string_view::npos) before.remove_prefix(open + std::string_view("<think>").size());
  reasoning = std::string(strip_newlines_left(before));
  const std::size_t last_close = content.rfind("</think>");
  content = std::string(strip_newlines_left(std::string_view(content).substr(last_close + 8)));
}

Status render_assistant(const ChatMessage& m, std::size_t index, bool keep_reasoning, PromptBuilder& out) {
  out.markup("<|assistant|>");
  std::string reasoning, content;
  split_reasoning(m, reasoning, content);
  if (keep_reasoning && !reasoning.empty()) {
    out.markup("<think>");
    out.client(python_strip(reasoning));
    out.markup("</think>");
  } else {
    out.markup("</think>");
  }
  out.client(python_strip(content));
  for (std::size_t c = 0; c < m.tool_calls.size(); ++c) {
    const ToolCall& call = m.tool_calls[c];
    if (!call.arguments.is_object()) {
      return invalid_argument("messages[" + std::to_string(index) + "].tool_calls[" + std::to_string(c) +
                              "].function.arguments: expected a JSON object");
    }
    out.markup("<tool_call>");
    out.client(call.name);
    for (const auto& [key, value] : call.arguments.items()) {
      out.markup("<arg_key>");
      out.client(key);
      out.markup("</arg_key><arg_value>");
      out.client(value.is_string() ? value.get_ref<const std::string&>() : python_json_dumps(value));
      out.markup("</arg_value>");
    }
    out.markup("</tool_call>");
  }
  return ok_status();
}

}  // namespace

Result<std::vector<PromptPiece>> render_glm_chat_pieces(const std::vector<ChatMessage>& messages,
                                                        const ChatTemplateOptions& options) {
  PromptBuilder out;
  out.markup("[gMASK]<sop>");
  if (!options.tools.is_null() && !options.tools.empty()) {
    if (!options.tools.is_array()) return invalid_argument("tools: expected an array");
    out.markup(kToolsPreamble);
    for (const auto& tool : options.tools) {
      out.client(python_json_dumps(tool));
      out.markup("\n");
    }
    out.markup(kToolsPostamble);
  }

  std::ptrdiff_t last_user = -1;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "user") last_user = static_cast<std::ptrdiff_t>(i);
  }

  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out.markup("<|user|>");
      std::size_t at = 0;
      for (const ChatMedia& item : m.media) {
        out.client(std::string_view(m.content).substr(at, item.offset - at));
        out.media(item.index);
        at = item.offset;
      }
      out.client(std::string_view(m.content).substr(at));
    } else if (m.role == "assistant") {
      const bool keep_reasoning = !options.clear_thinking || static_cast<std::ptrdiff_t>(i) > last_user;
      KILN_RETURN_IF_ERROR(render_assistant(m, i, keep_reasoning, out));
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out.markup("<|observation|>");
      out.markup("<tool_response>");
      out.client(m.content);
      out.markup("</tool_response>");
    } else if (m.role == "system") {
      out.markup("<|system|>");
      out.client(m.content);
    } else {
      return invalid_argument("messages[" + std::to_string(i) + "].role: '" + m.role +
                              "' is not one of system, user, assistant, tool");
    }
  }
  if (options.add_generation_prompt) {
    out.markup(options.enable_thinking ? "<|assistant|><think>" : "<|assistant|></think>");
  }
  return out.take();
}

Result<std::string> render_glm_chat(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::vector<PromptPiece> pieces, render_glm_chat_pieces(messages, options));
  std::string text;
  for (const PromptPiece& piece : pieces) text += piece.text;
  return text;
}

// zai-org/GLM-4.7 chat_template.jinja (MIT licence), byte for byte as tests/data/chat_templates/glm4_moe_lite holds it.
const std::string& glm47_chat_template_source() {
  static const std::string source = R"JINJA([gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>{{ visible_text(m.content) }}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if ((clear_thinking is defined and not clear_thinking) or loop.index0 > ns.last_user_index) and reasoning_content -%}
{{ '<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '</think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{- '<tool_call>' + tc.name -}}
{% set _args = tc.arguments %}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>{% endfor %}</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '<tool_response>' }}
{{- m.content }}
{{- '</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}
<tool_response>{{ tr.output if tr.output is defined else tr }}</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}
{%- endif -%}
)JINJA";
  return source;
}

}  // namespace kiln
