// Python.h first: it sets feature macros the C library headers read.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "tokenizer/jinja_chat_template.h"

#include <algorithm>
#include <fstream>
#include <mutex>
#include <sstream>

// AddressSanitizer builds (clang: __has_feature; gcc: __SANITIZE_ADDRESS__).
#if defined(__SANITIZE_ADDRESS__)
#define KILN_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_UNDER_ASAN 1
#endif
#endif
#ifndef KILN_UNDER_ASAN
#define KILN_UNDER_ASAN 0
#endif

namespace kiln {
namespace {

using ojson = nlohmann::ordered_json;

// transformers 5.17 utils/chat_template_utils.py (_cached_compile_jinja_template, render_jinja_template), minus what
// tokenize=False never uses (the assistant-token tracker records nothing, so {% generation %} renders its body).
constexpr const char* kRendererModule = R"PY(
import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationTag(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


_compiled = {}


def _compile(source):
    template = _compiled.get(source)
    if template is None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        template = env.from_string(source)
        _compiled[source] = template
    return template


def render(source, request):
    r = json.loads(request)
    kwargs = dict(r["special_tokens"])
    kwargs.update(r["kwargs"])
    return _compile(source).render(messages=r["messages"], tools=r["tools"], documents=None,
                                   add_generation_prompt=r["add_generation_prompt"], **kwargs)
)PY";

// The interpreter, started once per process and kept for its life (finalizing CPython with other threads
// around is not safe). Every call into it holds the GIL.
class PythonJinja {
 public:
  static Result<PythonJinja*> get() {
    static std::once_flag once;
    static PythonJinja* instance = nullptr;
    static Status failure;
    std::call_once(once, [] {
      auto* p = new PythonJinja();
      failure = p->start();
      if (failure.ok()) instance = p;
    });
    if (!instance) return failure;
    return instance;
  }

  Result<std::string> render(const std::string& source, const std::string& request) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    Result<std::string> out = call(source, request);
    PyGILState_Release(gil);
    return out;
  }

 private:
  Status start() {
    if (!Py_IsInitialized()) {
#if KILN_UNDER_ASAN
      // Under AddressSanitizer, CPython's own allocator (pymalloc's mmap'd arenas) hides the malloc'd blocks its
      // objects point to from LeakSanitizer's scan, which then reports each of them at exit; with plain malloc they
      // stay reachable from the interpreter's roots.
      PyPreConfig pre;
      PyPreConfig_InitIsolatedConfig(&pre);
      pre.allocator = PYMEM_ALLOCATOR_MALLOC;
      if (const PyStatus ps = Py_PreInitialize(&pre); PyStatus_Exception(ps))
        return failed_precondition(std::string("chat template: cannot pre-initialise the embedded Python: ") +
                                   (ps.err_msg ? ps.err_msg : "unknown error"));
#endif
      PyConfig config;
      PyConfig_InitIsolatedConfig(&config);
      config.install_signal_handlers = 0;  // SIGINT stays kiln's
      const PyStatus st = Py_InitializeFromConfig(&config);
      PyConfig_Clear(&config);
      if (PyStatus_Exception(st)) {
        return failed_precondition(std::string("chat template: cannot start the embedded Python: ") +
                                   (st.err_msg ? st.err_msg : "unknown error"));
      }
      Status s = load_module();
      PyEval_SaveThread();  // this thread gave up the GIL; every render takes it
      return s;
    }
    const PyGILState_STATE gil = PyGILState_Ensure();
    Status s = load_module();
    PyGILState_Release(gil);
    return s;
  }

  Status load_module() {
    PyObject* code = Py_CompileString(kRendererModule, "<kiln chat template renderer>", Py_file_input);
    PyObject* module = code ? PyImport_ExecCodeModule("kiln_chat_template_renderer", code) : nullptr;
    Py_XDECREF(code);
    if (module) render_ = PyObject_GetAttrString(module, "render");
    Py_XDECREF(module);
    if (!render_) {
      return failed_precondition("chat template: the embedded Python cannot load Jinja2 (" + python_error() +
                                 "); install python3-jinja2 (tools/setup.sh does)");
    }
    return ok_status();
  }

  // The pending Python exception as "Type: message", cleared.
  static std::string python_error() {
    PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
    PyErr_Fetch(&type, &value, &trace);
    PyErr_NormalizeException(&type, &value, &trace);
    std::string out = "unknown error";
    if (value) {
      PyObject* text = PyObject_Str(value);
      const char* utf8 = text ? PyUnicode_AsUTF8(text) : nullptr;
      out = utf8 ? utf8 : "unprintable error";
      Py_XDECREF(text);
      PyErr_Clear();
    }
    if (type) {
      PyObject* name = PyObject_GetAttrString(type, "__name__");
      const char* utf8 = name ? PyUnicode_AsUTF8(name) : nullptr;
      if (utf8) out = std::string(utf8) + ": " + out;
      Py_XDECREF(name);
      PyErr_Clear();
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(trace);
    return out;
  }

  Result<std::string> call(const std::string& source, const std::string& request) {
    PyObject* result = PyObject_CallFunction(render_, "s#s#", source.data(), static_cast<Py_ssize_t>(source.size()),
                                             request.data(), static_cast<Py_ssize_t>(request.size()));
    if (!result) return invalid_argument("chat template: " + python_error());
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_Check(result) ? PyUnicode_AsUTF8AndSize(result, &size) : nullptr;
    Result<std::string> out = utf8 ? Result<std::string>(std::string(utf8, static_cast<size_t>(size)))
                                   : Result<std::string>(invalid_argument("chat template: " + python_error()));
    Py_DECREF(result);
    return out;
  }

  PyObject* render_ = nullptr;
};

Result<std::string> read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Placeholders for special-token texts in client strings: U+E000, the token's index in decimal, U+E001. Index
// `specials.size()` stands for a U+E000 the client itself wrote, so the output can always be cut back.
constexpr std::string_view kOpen = "\xEE\x80\x80", kClose = "\xEE\x80\x81";

bool escape_string(std::string& s, const std::vector<std::string>& specials) {
  std::string out;
  bool changed = false;
  size_t i = 0;
  while (i < s.size()) {
    size_t which = specials.size() + 1;
    if (s.compare(i, kOpen.size(), kOpen) == 0) {
      which = specials.size();
    } else {
      for (size_t k = 0; k < specials.size(); ++k) {
        if (!specials[k].empty() && s.compare(i, specials[k].size(), specials[k]) == 0) {
          which = k;
          break;
        }
      }
    }
    if (which > specials.size()) {
      out += s[i++];
      continue;
    }
    out += kOpen;
    out += std::to_string(which);
    out += kClose;
    i += which == specials.size() ? kOpen.size() : specials[which].size();
    changed = true;
  }
  if (changed) s = std::move(out);
  return changed;
}

bool escape_json(ojson& j, const std::vector<std::string>& specials) {
  bool changed = false;
  if (j.is_string()) {
    changed = escape_string(j.get_ref<std::string&>(), specials);
  } else if (j.is_structured()) {
    for (auto& item : j) changed |= escape_json(item, specials);
  }
  return changed;
}

// Cuts a rendering with placeholders into pieces; false when a placeholder is malformed.
bool unescape(const std::string& rendered, const std::vector<std::string>& specials, std::vector<PromptPiece>& pieces,
              std::string& text) {
  pieces.clear();
  text.clear();
  std::string markup;
  size_t i = 0;
  while (i < rendered.size()) {
    const size_t open = rendered.find(kOpen, i);
    if (open == std::string::npos) {
      markup.append(rendered, i, std::string::npos);
      break;
    }
    markup.append(rendered, i, open - i);
    const size_t close = rendered.find(kClose, open + kOpen.size());
    if (close == std::string::npos) return false;
    const std::string digits = rendered.substr(open + kOpen.size(), close - open - kOpen.size());
    if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
    const size_t which = std::stoul(digits);
    if (which > specials.size()) return false;
    if (!markup.empty()) pieces.push_back({markup, false});
    text += markup;
    markup.clear();
    const std::string literal = which == specials.size() ? std::string(kOpen) : specials[which];
    pieces.push_back({literal, true});
    text += literal;
    i = close + kClose.size();
  }
  if (!markup.empty()) pieces.push_back({markup, false});
  text += markup;
  return true;
}

}  // namespace

Result<ojson> template_messages(const ojson& openai_messages) {
  if (!openai_messages.is_array()) return invalid_argument("messages must be an array");
  ojson out = openai_messages;
  for (size_t i = 0; i < out.size(); ++i) {
    ojson& m = out[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return invalid_argument(at + " must be an object");
    if (m.contains("content") && m["content"].is_null()) m["content"] = "";
    const auto calls = m.find("tool_calls");
    if (calls == m.end() || calls->is_null()) continue;
    if (!calls->is_array()) return invalid_argument(at + ".tool_calls must be an array");
    for (size_t j = 0; j < calls->size(); ++j) {
      ojson& call = (*calls)[j];
      const std::string call_at = at + ".tool_calls[" + std::to_string(j) + "]";
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
        return invalid_argument(call_at + ".function must be an object");
      ojson& fn = call["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      ojson args = ojson::parse(fn["arguments"].get<std::string>(), nullptr, false);
      if (!args.is_object())
        return invalid_argument(call_at + ".function.arguments must be a JSON object (as a string)");
      fn["arguments"] = std::move(args);
    }
  }
  return out;
}

Result<JinjaChatTemplate> JinjaChatTemplate::from_source(std::string source, ojson special_tokens) {
  auto python = PythonJinja::get();
  if (!python.ok()) return python.status();
  JinjaChatTemplate t;
  t.default_source_ = std::move(source);
  t.special_tokens_ = std::move(special_tokens);
  return t;
}

Result<std::optional<JinjaChatTemplate>> JinjaChatTemplate::from_checkpoint(const std::filesystem::path& dir) {
  ojson config = ojson::object();
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    auto text = read_text(config_path);
    if (!text.ok()) return text.status();
    config = ojson::parse(*text, nullptr, false);
    if (!config.is_object()) return data_loss(config_path.string() + ": not a JSON object");
  }
  ojson specials = ojson::object();
  for (const char* key :
       {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    const auto it = config.find(key);
    if (it == config.end()) continue;
    if (it->is_string()) specials[key] = *it;
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) specials[key] = (*it)["content"];
  }
  std::string default_source, tool_use_source;
  const auto jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    auto text = read_text(jinja_path);
    if (!text.ok()) return text.status();
    default_source = std::move(text).value();
  } else if (const auto it = config.find("chat_template"); it != config.end()) {
    if (it->is_string()) {
      default_source = it->get<std::string>();
    } else if (it->is_array()) {
      for (const auto& named : *it) {
        if (!named.is_object() || !named.contains("name") || !named.contains("template") ||
            !named["name"].is_string() || !named["template"].is_string()) {
          return data_loss(config_path.string() + ": chat_template: expected {\"name\", \"template\"} entries");
        }
        if (named["name"] == "default") default_source = named["template"].get<std::string>();
        if (named["name"] == "tool_use") tool_use_source = named["template"].get<std::string>();
      }
      if (default_source.empty()) return data_loss(config_path.string() + ": chat_template has no \"default\" entry");
    } else {
      return data_loss(config_path.string() + ": chat_template must be a string or a list of named templates");
    }
  }
  if (default_source.empty()) return std::optional<JinjaChatTemplate>();
  auto t = from_source(std::move(default_source), std::move(specials));
  if (!t.ok()) return t.status();
  t->tool_use_source_ = std::move(tool_use_source);
  return std::optional<JinjaChatTemplate>(std::move(t).value());
}

const std::string& JinjaChatTemplate::source(bool with_tools) const {
  return with_tools && !tool_use_source_.empty() ? tool_use_source_ : default_source_;
}

Result<std::string> JinjaChatTemplate::render(const ChatRenderInput& input) const {
  auto python = PythonJinja::get();
  if (!python.ok()) return python.status();
  const ojson request = {{"messages", input.messages},
                         {"tools", input.tools},
                         {"add_generation_prompt", input.add_generation_prompt},
                         {"special_tokens", special_tokens_},
                         {"kwargs", input.kwargs}};
  return (*python)->render(source(!input.tools.is_null()),
                           request.dump(-1, ' ', false, ojson::error_handler_t::replace));
}

Result<std::vector<PromptPiece>> JinjaChatTemplate::render_pieces(const ChatRenderInput& input,
                                                                  const std::vector<std::string>& special_tokens) const {
  // Longest first, so a token that starts with another one is matched whole.
  std::vector<std::string> specials = special_tokens;
  std::stable_sort(specials.begin(), specials.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  auto plain = render(input);
  if (!plain.ok()) return plain.status();
  // Escaping everything, then everything but assistant turns (whose text a template may parse for tags).
  for (const bool skip_assistant : {false, true}) {
    ChatRenderInput escaped = input;
    bool any = escape_json(escaped.tools, specials) | escape_json(escaped.kwargs, specials);
    for (auto& m : escaped.messages) {
      if (skip_assistant && m.is_object() && m.contains("role") && m["role"] == "assistant") continue;
      any |= escape_json(m, specials);
    }
    if (!any) {
      if (skip_assistant) break;
      return std::vector<PromptPiece>{{*plain, false}};
    }
    auto rendered = render(escaped);
    if (!rendered.ok()) continue;
    std::vector<PromptPiece> pieces;
    std::string text;
    if (unescape(*rendered, specials, pieces, text) && text == *plain) return pieces;
  }
  return std::vector<PromptPiece>{{*plain, false}};
}

}  // namespace kiln
