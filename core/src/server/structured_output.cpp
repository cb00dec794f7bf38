#include "server/structured_output.h"

#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <cctype>
#include <thread>

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

// The tool-call markup of the GLM format: special tokens the grammar must be able to write. Every other special
// token is invisible to xgrammar (an empty string), so no grammar ever allows it.
constexpr const char* kGlmToolMarkup[] = {"<tool_call>", "</tool_call>", "<arg_key>",
                                          "</arg_key>",  "<arg_value>",  "</arg_value>"};

// Whitespace between JSON tokens is free (models indent), but a run of it is bounded: a weak model would otherwise
// pad an answer with newlines until max_tokens.
constexpr int kMaxWhitespace = 32;

class XgrammarConstraint final : public TokenConstraint {
 public:
  // `refused`: a bitmask of tokens never allowed whatever the grammar says (null: none).
  XgrammarConstraint(const xgrammar::CompiledGrammar& grammar, int32_t vocab_size, const std::vector<uint32_t>* refused)
      : matcher_(grammar), words_(xgrammar::GetBitmaskSize(vocab_size)), scratch_(words_), refused_(refused) {}

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

  xgrammar::GrammarMatcher matcher_;
  bool broken_ = false;
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
      if (std::find(std::begin(kGlmToolMarkup), std::end(kGlmToolMarkup), text) != std::end(kGlmToolMarkup))
        vocab[id] = text;
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

Result<std::shared_ptr<TokenConstraint>> StructuredOutput::json_object() {
  Xgrammar& e = state();
  return make_constraint(
      [&] {
        return e.compiler.CompileJSONSchema(R"({"type": "object"})", true, std::nullopt, std::nullopt, true,
                                            kMaxWhitespace);
      },
      static_cast<int32_t>(vocab_size_), &e.json_refused);
}

Result<std::shared_ptr<TokenConstraint>> StructuredOutput::json_schema(const ojson& schema, bool strict) {
  Xgrammar& e = state();
  const std::string text = schema.dump();
  return make_constraint(
      [&] {
        return e.compiler.CompileJSONSchema(text, /*any_whitespace=*/true, std::nullopt, std::nullopt,
                                            /*strict_mode=*/strict, kMaxWhitespace);
      },
      static_cast<int32_t>(vocab_size_), &e.json_refused);
}

Result<std::shared_ptr<TokenConstraint>> StructuredOutput::glm_tool_call(const ojson& tools, const std::string& name) {
  ojson format;
  if (!name.empty()) {
    const auto tool =
        std::find_if(tools.begin(), tools.end(), [&](const ojson& t) { return t["function"]["name"] == name; });
    if (tool == tools.end()) return invalid_argument("no tool named \"" + name + "\"");
    format = {{"type", "sequence"},
              {"elements", ojson::array({glm_arguments(function_parameters(*tool)),
                                         {{"type", "const_string"}, {"value", "</tool_call>"}}})}};
  } else {
    ojson calls = ojson::array();
    for (const ojson& tool : tools)
      calls.push_back({{"type", "tag"},
                       {"begin", tool["function"]["name"]},
                       {"content", glm_arguments(function_parameters(tool))},
                       {"end", "</tool_call>"}});
    format = calls.size() == 1 ? calls[0] : ojson{{"type", "or"}, {"elements", calls}};
  }
  const std::string text = ojson{{"type", "structural_tag"}, {"format", format}}.dump();
  Xgrammar& e = state();
  return make_constraint([&] { return e.compiler.CompileStructuralTag(text); }, static_cast<int32_t>(vocab_size_));
}

}  // namespace kiln
