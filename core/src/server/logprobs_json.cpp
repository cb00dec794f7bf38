#include "server/logprobs_json.h"

#include <cmath>
#include <string>

namespace kiln {
namespace {

using ojson = nlohmann::ordered_json;

double finite(float logprob) { return std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0; }

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  const int32_t ids[] = {id};
  return tokenizer.decode(ids);
}

ojson token_json(const Tokenizer& tokenizer, int32_t id, float logprob) {
  ojson bytes = ojson::array();
  for (unsigned char c : tokenizer.token_bytes(id)) bytes.push_back(static_cast<int>(c));
  return {{"token", token_text(tokenizer, id)}, {"logprob", finite(logprob)}, {"bytes", std::move(bytes)}};
}

}  // namespace

ojson chat_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& entries) {
  ojson content = ojson::array();
  for (const TokenLogprob& e : entries) {
    ojson item = token_json(tokenizer, e.token, e.logprob);
    ojson top = ojson::array();
    for (const auto& [id, logprob] : e.top) top.push_back(token_json(tokenizer, id, logprob));
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

ojson completion_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& entries,
                               int64_t& text_offset) {
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top_logprobs = ojson::array(),
        offsets = ojson::array();
  for (const TokenLogprob& e : entries) {
    const std::string text = token_text(tokenizer, e.token);
    tokens.push_back(text);
    token_logprobs.push_back(finite(e.logprob));
    ojson top = ojson::object();
    for (const auto& [id, logprob] : e.top) top[token_text(tokenizer, id)] = finite(logprob);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(text.size());
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace kiln
