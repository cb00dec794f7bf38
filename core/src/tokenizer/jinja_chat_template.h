// The checkpoint's own chat template (tokenizer_config.json "chat_template", or chat_template.jinja), rendered
// exactly as transformers' apply_chat_template(..., tokenize=False) renders it.
//
// Engine: Jinja2 itself, run by an embedded CPython (Debian's libpython3 + python3-jinja2), in the environment
// transformers builds (utils/chat_template_utils.py, 5.17): ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, the loopcontrols extension and the {% generation %} tag, transformers' tojson filter
// (json.dumps, ensure_ascii=False, indent/separators/sort_keys), raise_exception and strftime_now; the template's
// variables are messages, tools (None when there are none), documents (None), add_generation_prompt, the
// tokenizer's named special tokens (bos_token, eos_token, ...) and then the request's chat_template_kwargs.
// Candidates compared (docs/chat_templates.md): C++ engines (minja, jinja2cpp, inja) are in no Debian release and
// each implements a subset of Jinja with its own Python-method emulation (str.split, dict.items, loop.*,
// namespace, macros), so "exactly as transformers" would hold only as far as their tests go; Jinja2 under
// CPython is the engine transformers runs, so it is identical by construction, and Debian packages both pieces.
// Cost: the interpreter starts and imports Jinja2 once per process (~80 ms); a fixture conversation renders in ~0.2
// ms; renders hold the GIL, so concurrent requests render one at a time (the tokenizer after it runs in
// parallel). Sandbox: the template runs in Jinja's immutable sandbox, as in transformers; the interpreter is
// isolated (no user site, no PYTHON* environment variables).
//
// Client text and special tokens: every string the request brought (message fields, tools, kwargs) has its
// special-token texts (e.g. "<|user|>") replaced by private-use placeholders before rendering, and the output is cut
// back into PromptPieces: the placeholders become client-text pieces (tokenized as plain text), the rest markup.
// A template that inspects such a token (GLM splits an assistant turn's content at "</think>") would render
// differently with the placeholder; the renderer then renders again without placeholders in assistant messages,
// and if that still differs, with none at all (the whole prompt markup, as transformers tokenizes it).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct ChatRenderInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI-shaped, as the template reads them
  nlohmann::ordered_json tools;                                       // null = None
  bool add_generation_prompt = true;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
};

// The messages a template gets from an OpenAI request: as the client sent them, except that null content reads as ""
// and tool-call arguments given as JSON strings are parsed into objects (as vLLM does: templates iterate them).
// Fails on arguments that are not a JSON object, naming "messages[i].tool_calls[j].function.arguments".
Result<nlohmann::ordered_json> template_messages(const nlohmann::ordered_json& openai_messages);

class JinjaChatTemplate {
 public:
  // The checkpoint directory's template: chat_template.jinja if present (transformers 5 saves it there), else
  // tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}: "tool_use" when tools are
  // given and it exists, else "default"). Named special tokens come from tokenizer_config.json. nullopt when the
  // checkpoint has no template; errors name the file.
  static Result<std::optional<JinjaChatTemplate>> from_checkpoint(const std::filesystem::path& dir);
  // A template given as text; `special_tokens` maps bos_token etc. to their text.
  static Result<JinjaChatTemplate> from_source(std::string source,
                                               nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());

  // The rendered prompt. A template error (raise_exception, a syntax error, an undefined operation) fails with
  // kInvalidArgument and Jinja's message.
  Result<std::string> render(const ChatRenderInput& input) const;
  // The same text as pieces: client-brought special-token texts are client text, the rest markup (see above).
  Result<std::vector<PromptPiece>> render_pieces(const ChatRenderInput& input,
                                                 const std::vector<std::string>& special_tokens) const;

  // The template used for this input (the tool_use one when there are tools and the checkpoint names one).
  const std::string& source(bool with_tools) const;

 private:
  std::string default_source_, tool_use_source_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace kiln
