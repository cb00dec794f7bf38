#include "server/completions_route.h"

#include <chrono>

#include "server/logprobs_json.h"

namespace kiln {
namespace {

using ojson = nlohmann::ordered_json;

// OpenAI's documented default for /v1/completions.
constexpr int64_t kDefaultCompletionTokens = 16;

class CompletionWriter : public ResponseWriter {
 public:
  CompletionWriter(std::string model, bool include_usage, const Tokenizer* logprobs_tokenizer)
      : logprobs_(logprobs_tokenizer),
        id_(random_id("cmpl-")),
        model_(std::move(model)),
        created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                     .count()),
        include_usage_(include_usage) {}

  std::string stream_begin() override { return {}; }

  std::string stream_pieces(const OutputPieces& pieces) override {
    std::string text;
    for (const auto& p : pieces) text += p.text;
    return text.empty() ? std::string() : sse_event(body(text, nullptr, false));
  }

  // The logprobs received since the last chunk (null when the request did not ask).
  ojson take_logprobs() {
    if (!logprobs_) return nullptr;
    ojson out = completion_logprobs_json(*logprobs_, pending_logprobs_, text_offset_);
    pending_logprobs_.clear();
    return out;
  }

  std::string stream_end(const GenerationResult& result) override {
    return stream_finish(result) + stream_close(result.usage);
  }
  std::string stream_finish(const GenerationResult& result) override {
    return sse_event(body("", result.finish_reason, false));
  }
  std::string stream_close(const Usage& usage) override {
    std::string out;
    if (include_usage_) {
      ojson last = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_}};
      last["choices"] = ojson::array();
      last["usage"] = usage_json(usage);
      out += sse_event(last);
    }
    return out + "data: [DONE]\n\n";
  }

  std::unique_ptr<ResponseWriter> for_choice(int index) const override {
    auto w = std::make_unique<CompletionWriter>(*this);
    w->index_ = index;
    w->pending_logprobs_.clear();
    return w;
  }

  std::string stream_error(const ApiError& error) override { return sse_event(error.to_json()) + "data: [DONE]\n\n"; }

  ojson complete(const OutputPieces& pieces, const GenerationResult& result) override {
    std::string text;
    for (const auto& p : pieces) text += p.text;
    ojson out = body(text, result.finish_reason, true);
    out["usage"] = usage_json(result.usage);
    return out;
  }

 private:
  ojson body(const std::string& text, ojson finish_reason, bool final_body) {
    ojson b = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_}};
    b["choices"] = ojson::array(
        {{{"index", index_}, {"text", text}, {"logprobs", take_logprobs()}, {"finish_reason", std::move(finish_reason)}}});
    if (include_usage_ && !final_body) b["usage"] = nullptr;
    return b;
  }

  const Tokenizer* logprobs_;  // set when the request asked for logprobs
  int64_t text_offset_ = 0;
  std::string id_, model_;
  int64_t created_;
  bool include_usage_;
  int index_ = 0;  // the choice this writer writes
};

// A string, a list holding one string, or a list of token ids.
std::optional<ApiError> read_prompt(const ServerContext& ctx, const ojson* prompt, std::vector<int32_t>& ids) {
  if (!prompt) return bad_request("'prompt' is required", "prompt");
  const ojson* text = prompt;
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) text = &(*prompt)[0];
  if (text->is_string()) {
    ids = ctx.tokenizer->encode(text->get<std::string>(), /*parse_special=*/true);
    return std::nullopt;
  }
  if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
    const int64_t vocab = ctx.tokenizer->vocab_size();
    for (size_t i = 0; i < prompt->size(); ++i) {
      const auto& v = (*prompt)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
        return bad_request("prompt[" + std::to_string(i) + "] is not a token id in [0, " + std::to_string(vocab) + ")",
                           "prompt");
      }
      ids.push_back(v.get<int32_t>());
    }
    return std::nullopt;
  }
  return bad_request(
      "'prompt' must be a string or a list of token ids (one prompt per request), got " + json_type_phrase(*prompt),
      "prompt");
}

}  // namespace

std::optional<ApiError> prepare_completion(const ServerContext& ctx, const ojson& body, PreparedGeneration& out) {
  RequestReader reader(body);
  if (auto e = check_model(ctx, reader)) return e;
  GenerationRequest& request = out.request;
  read_sampling_fields(reader, {"max_tokens"}, request);
  read_penalty_fields(ctx, reader, request);
  if (auto echo = reader.boolean("echo"); echo && *echo) reader.fail(bad_request("echo is not supported", "echo"));
  if (reader.value("suffix")) reader.fail(bad_request("suffix is not supported", "suffix"));
  if (auto best_of = reader.integer("best_of", 1, INT32_MAX); best_of && *best_of != 1) {
    reader.fail(bad_request("only best_of=1 is supported", "best_of"));
  }
  // OpenAI's completions take up to 5 alternatives.
  const auto logprobs = reader.integer("logprobs", 0, 5);
  if (!reader.ok()) return reader.error();
  if (logprobs) {
    if (auto e = request_logprobs(ctx, *logprobs, "logprobs", request)) return e;
  }
  if (!request.requested_max_tokens) request.requested_max_tokens = kDefaultCompletionTokens;
  std::vector<int32_t> ids;
  if (auto e = read_prompt(ctx, reader.value("prompt"), ids)) return e;
  if (auto e = set_prompt(ctx, std::move(ids), request)) {
    if (e->param == "messages") e->param = "prompt";
    return e;
  }
  out.writer = std::make_unique<CompletionWriter>(ctx.served_name, request.include_usage,
                                                  request.logprobs ? ctx.tokenizer : nullptr);
  return std::nullopt;
}

}  // namespace kiln
