#include "server/structured_output.h"

#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <cctype>
#include <thread>

#include "server/deepseek_v3_tool_call_parser.h"

namespace kiln {

struct StructuredOutput::Xgrammar {
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  // Tokens a JSON answer never takes: any holding a control byte other than \n and \r. xgrammar's JSON strings
  // admit raw control characters except \r and \n, which JSON forbids unescaped (a weak model on a byte-level
  // vocabulary writes them, and the answer no longer parses); JSON's whitespace needs no tab either.
  std::vector<uint32_t> json_refused;
};

namespace {

using ojson = nlohmann::ordered_json;

// Special tokens a grammar must be able to write: the tool-call markup of the GLM and DeepSeek-V3 formats and the
// end of GLM's reasoning (a grammar that lets the model reason first). Every other special token is invisible to
// xgrammar (an empty string), so no grammar ever allows it. (A tokenizer without them spells the markup from
// ordinary tokens, which the grammar allows as well.) Built on first use: the DeepSeek strings are another
// translation unit's statics.
bool is_grammar_markup(const std::string& token) {
  using P = DeepSeekV3ToolCallParser;
  static const std::vector<std::string> markup = {
      "<tool_call>",  "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "</think>",
      P::kCallsBegin, P::kCallBegin,  P::kSep,     P::kCallEnd,  P::kCallsEnd};
  return std::find(markup.begin(), markup.end(), token) != markup.end();
}

// Whitespace between JSON tokens is free (models indent), but a run of it is bounded: a weak model would otherwise
// pad an answer with newlines until max_tokens.
constexpr int kMaxWhitespace = 32;

class XgrammarConstraint final : public TokenConstraint {
 public:
  // `refused`: a bitmask of tokens never allowed whatever the grammar says (null: none).
  XgrammarConstraint(const xgrammar::CompiledGrammar& grammar, int32_t vocab_size, const std::vector<uint32_t>* refused)
      : grammar_(grammar),
        matcher_(grammar),
        vocab_size_(vocab_size),
        words_(xgrammar::GetBitmaskSize(vocab_size)),
        scratch_(words_),
        refused_(refused) {}

  std::shared_ptr<TokenConstraint> fresh() const override {
    return std::make_shared<XgrammarConstraint>(grammar_, vocab_size_, refused_);
  }

  // These run on the engine's thread, where an exception would end the process: a failure inside xgrammar becomes
  // an empty mask or a refused token instead, and the engine ends the request with an error.
  void fill_allowed(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    try {
      fill(mask);
    } catch (const std::exception&) {
      std::fill(mask.begin(), mask.end(), 0u);
    }
  }
  bool accept(int32_t token) override {
    try {
      return !broken_ && token >= 0 && matcher_.AcceptToken(token);
    } catch (const std::exception&) {
      return false;
    }
  }
  void rollback(int num_tokens) override {
    try {
      matcher_.Rollback(num_tokens);
    } catch (const std::exception&) {
      broken_ = true;  // a state we cannot trust: refuse everything from now on
    }
  }
  bool terminated() const override { return matcher_.IsTerminated(); }

 private:
  void fill(std::span<uint32_t> mask) {
    if (broken_) return;
    int64_t shape[1] = {words_};
    DLTensor t{};
    t.data = scratch_.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = shape;
    matcher_.FillNextTokenBitmask(&t);
    const size_t n = std::min(mask.size(), scratch_.size());
    std::copy_n(reinterpret_cast<const uint32_t*>(scratch_.data()), n, mask.begin());
    if (refused_)
      for (size_t w = 0; w < n && w < refused_->size(); ++w) mask[w] &= ~(*refused_)[w];
  }

  xgrammar::CompiledGrammar grammar_;  // a shared handle: fresh() matchers start from it
  xgrammar::GrammarMatcher matcher_;
  bool broken_ = false;
  int32_t vocab_size_;
  int32_t words_;
  std::vector<int32_t> scratch_;
  const std::vector<uint32_t>* refused_;
};

// xgrammar's messages start with its log prefix ("[12:00:00] /path/file.cc:123: "), which means nothing to a client.
std::string without_log_prefix(std::string message) {
  if (!message.empty() && message[0] == '[') {
    const size_t source = message.find(".cc:");
    const size_t colon = source == std::string::npos ? source : message.find(": ", source + 4);
    if (colon != std::string::npos) message.erase(0, colon + 2);
  }
  while (!message.empty() && std::isspace(static_cast<unsigned char>(message.back()))) message.pop_back();
  return message;
}

// xgrammar reports a grammar it cannot build by throwing; the message says what is wrong with it.
template <typename Compile>
Result<std::shared_ptr<TokenConstraint>> make_constraint(Compile&& compile, int32_t vocab_size,
                                                         const std::vector<uint32_t>* refused = nullptr) {
  try {
    xgrammar::CompiledGrammar grammar = compile();
    return std::shared_ptr<TokenConstraint>(std::make_shared<XgrammarConstraint>(grammar, vocab_size, refused));
  } catch (const std::exception& e) {
    return invalid_argument(without_log_prefix(e.what()));
  }
}

ojson function_parameters(const ojson& tool) {
  const ojson& fn = tool["function"];
  const auto p = fn.find("parameters");
  if (p == fn.end() || p->is_null()) return {{"type", "object"}, {"properties", ojson::object()}};
  return *p;
}

ojson glm_arguments(const ojson& parameters) {
  return {{"type", "json_schema"}, {"json_schema", parameters}, {"style", "glm_xml"}};
}

ojson json_arguments(const ojson& parameters) {
  return {{"type", "json_schema"}, {"json_schema", parameters}, {"max_whitespace_cnt", kMaxWhitespace}};
}

ojson const_string(const std::string& value) {
  return {{"type", "const_string"}, {"value", value}};
}

ojson sequence(ojson elements) {
  return {{"type", "sequence"}, {"elements", std::move(elements)}};
}

ojson one_of(ojson elements) {
  return elements.size() == 1 ? elements[0] : ojson{{"type", "or"}, {"elements", std::move(elements)}};
}

// `content` min..max times (max -1: unbounded).
ojson repeat(ojson content, int min, int max) {
  return {{"type", "repeat"}, {"min", min}, {"max", max}, {"content", std::move(content)}};
}

const ojson* find_tool(const ojson& tools, const std::string& name) {
  const auto tool =
      std::find_if(tools.begin(), tools.end(), [&](const ojson& t) { return t["function"]["name"] == name; });
  return tool == tools.end() ? nullptr : &*tool;
}

// Free text up to "</think>" (the prompt opened <think>), at most `max_tokens` tokens of it when that is set.
ojson reasoning_format(const ReasoningPrefix& reasoning) {
  ojson text = {{"type", "any_text"}};
  if (reasoning.max_tokens >= 0) text["max_tokens"] = reasoning.max_tokens;
  return {{"type", "tag"}, {"begin", ""}, {"content", std::move(text)}, {"end", "</think>"}};
}

// GLM: <tool_call>NAME<arg_key>…</arg_value></tool_call>, possibly several in a row. `opened`: the prompt wrote
// "<tool_call>" (and the name, when one is forced).
ojson glm_calls(const ojson& tools, const ToolCallGrammar& call, bool opened) {
  static const std::string kOpen = "<tool_call>", kClose = "</tool_call>";
  if (!call.name.empty()) {
    const ojson arguments = glm_arguments(function_parameters(*find_tool(tools, call.name)));
    if (opened) return sequence({arguments, const_string(kClose)});
    return {{"type", "tag"}, {"begin", kOpen + call.name}, {"content", arguments}, {"end", kClose}};
  }
  ojson named = ojson::array();  // a call after its "<tool_call>"
  for (const ojson& tool : tools)
    named.push_back({{"type", "tag"},
                     {"begin", tool["function"]["name"]},
                     {"content", glm_arguments(function_parameters(tool))},
                     {"end", kClose}});
  const ojson whole = sequence({const_string(kOpen), one_of(named)});
  if (opened) return call.parallel ? sequence({one_of(named), repeat(whole, 0, -1)}) : one_of(named);
  return call.parallel ? repeat(whole, 1, -1) : whole;
}

// DeepSeek-V3: <｜tool▁calls▁begin｜> then calls <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```
// <｜tool▁call▁end｜>, then <｜tool▁calls▁end｜>. `opened`: the prompt wrote the section's opening (and, when a name is
// forced, the call's head up to its arguments).
ojson deepseek_v3_calls(const ojson& tools, const ToolCallGrammar& call, bool opened) {
  using P = DeepSeekV3ToolCallParser;
  const std::string close = P::kArgumentsClose + P::kCallEnd;
  auto whole_call = [&](const ojson& tool) {
    return ojson{{"type", "tag"},
                 {"begin", P::kCallBegin + "function" + P::kSep + tool["function"]["name"].get<std::string>() +
                               P::kArgumentsOpen},
                 {"content", json_arguments(function_parameters(tool))},
                 {"end", close}};
  };
  ojson calls;
  if (!call.name.empty()) {
    const ojson& tool = *find_tool(tools, call.name);
    if (opened) return sequence({json_arguments(function_parameters(tool)), const_string(close + P::kCallsEnd)});
    calls = whole_call(tool);
  } else {
    ojson any = ojson::array();
    for (const ojson& tool : tools) any.push_back(whole_call(tool));
    calls = call.parallel ? repeat(one_of(any), 1, -1) : one_of(any);
  }
  ojson elements = ojson::array();
  if (!opened) elements.push_back(const_string(P::kCallsBegin));
  elements.push_back(calls);
  elements.push_back(const_string(P::kCallsEnd));
  return sequence(std::move(elements));
}

// A JSON answer's grammar, after free reasoning when asked for.
xgrammar::Grammar json_answer(const std::string& schema, bool strict, const ReasoningPrefix& reasoning) {
  xgrammar::Grammar answer = xgrammar::Grammar::FromJSONSchema(schema, /*any_whitespace=*/true, std::nullopt,
                                                               std::nullopt, strict, kMaxWhitespace);
  if (!reasoning.enabled) return answer;
  const std::string tag = ojson{{"type", "structural_tag"}, {"format", reasoning_format(reasoning)}}.dump();
  auto prefix = xgrammar::Grammar::FromStructuralTag(tag);
  if (auto* error = std::get_if<xgrammar::StructuralTagError>(&prefix))
    std::visit([](const auto& e) -> void { throw e; }, *error);  // as the compiler's own calls report errors
  return xgrammar::Grammar::Concat({std::get<xgrammar::Grammar>(prefix), answer});
}

}  // namespace

StructuredOutput::StructuredOutput(const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> stop_token_ids)
    : tokenizer_(tokenizer),
      vocab_size_(std::max<int64_t>(vocab_size, tokenizer.vocab_size())),
      stop_token_ids_(std::move(stop_token_ids)) {}

StructuredOutput::~StructuredOutput() = default;

StructuredOutput::Xgrammar& StructuredOutput::state() {
  // Building the sorted vocabulary takes a while on a 150 K vocabulary, and only constrained requests need it.
  std::call_once(once_, [&] {
    const int64_t tokenizer_vocab = tokenizer_.vocab_size();
    std::vector<std::string> vocab(static_cast<size_t>(tokenizer_vocab));
    for (int64_t id = 0; id < tokenizer_vocab; ++id) {
      const int32_t t = static_cast<int32_t>(id);
      if (!tokenizer_.is_special(t)) {
        vocab[id] = tokenizer_.token_bytes(t);
        continue;
      }
      const std::string text = tokenizer_.id_to_token(t);
      if (is_grammar_markup(text)) vocab[id] = text;
    }
    // RAW: the strings are the tokens' bytes as they decode (kiln's tokenizer undid the byte-level mapping).
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, static_cast<int>(vocab_size_), stop_token_ids_);
    const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
    std::vector<uint32_t> refused(static_cast<size_t>(xgrammar::GetBitmaskSize(static_cast<int>(vocab_size_))), 0u);
    for (int64_t id = 0; id < tokenizer_vocab; ++id)
      for (unsigned char b : vocab[id])
        if (b < 0x20 && b != '\n' && b != '\r') {
          refused[id / 32] |= 1u << (id % 32);
          break;
        }
    xgrammar_ = std::make_unique<Xgrammar>(Xgrammar{info, xgrammar::GrammarCompiler(info, threads), std::move(refused)});
  });
  return *xgrammar_;
}

Result<std::shared_ptr<TokenConstraint>> StructuredOutput::json_object(const ReasoningPrefix& reasoning) {
  Xgrammar& e = state();
  return make_constraint(
      [&] {
        if (!reasoning.enabled)
          return e.compiler.CompileJSONSchema(R"({"type": "object"})", true, std::nullopt, std::nullopt, true,
                                              kMaxWhitespace);
        return e.compiler.CompileGrammar(json_answer(R"({"type": "object"})", true, reasoning));
      },
      static_cast<int32_t>(vocab_size_), &e.json_refused);
}

Result<std::shared_ptr<TokenConstraint>> StructuredOutput::json_schema(const ojson& schema, bool strict,
                                                                       const ReasoningPrefix& reasoning) {
  Xgrammar& e = state();
  const std::string text = schema.dump();
  return make_constraint(
      [&] {
        if (!reasoning.enabled)
          return e.compiler.CompileJSONSchema(text, /*any_whitespace=*/true, std::nullopt, std::nullopt,
                                              /*strict_mode=*/strict, kMaxWhitespace);
        return e.compiler.CompileGrammar(json_answer(text, strict, reasoning));
      },
      static_cast<int32_t>(vocab_size_), &e.json_refused);
}

Result<std::shared_ptr<TokenConstraint>> StructuredOutput::tool_calls(const ojson& tools, const ToolCallGrammar& call) {
  if (!call.name.empty() && !find_tool(tools, call.name))
    return invalid_argument("no tool named \"" + call.name + "\"");
  if (call.parser != "glm47" && call.parser != "deepseek_v3")
    return invalid_argument("no tool-call grammar for the parser \"" + call.parser + "\"");
  // With reasoning first, the prompt could not open the call: the grammar writes the opening after "</think>".
  const bool opened = !call.reasoning.enabled;
  ojson format = call.parser == "glm47" ? glm_calls(tools, call, opened) : deepseek_v3_calls(tools, call, opened);
  if (call.reasoning.enabled) format = sequence({reasoning_format(call.reasoning), format});
  const std::string text = ojson{{"type", "structural_tag"}, {"format", format}}.dump();
  Xgrammar& e = state();
  // DeepSeek's arguments are JSON, which a raw control character would break (GLM's string values are raw text).
  const std::vector<uint32_t>* refused = call.parser == "deepseek_v3" ? &e.json_refused : nullptr;
  return make_constraint([&] { return e.compiler.CompileStructuralTag(text); }, static_cast<int32_t>(vocab_size_),
                         refused);
}

}  // namespace kiln
