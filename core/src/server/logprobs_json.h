// OpenAI's logprobs shapes for the tokens a request generated (engine-reported TokenLogprob entries). Each token's
// text is its decoding alone (a token holding part of a UTF-8 character reads as U+FFFD; "bytes" carries its raw
// bytes, as OpenAI's do). A log-probability of -inf (probability 0 in fp32) is written as -9999.0, as OpenAI does.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "server/generation_session.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

// Chat completions: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
// "refusal": null}.
nlohmann::ordered_json chat_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& entries);

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}; `text_offset` is
// where the first entry's text starts in the completion, advanced past the entries.
nlohmann::ordered_json completion_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& entries,
                                                int64_t& text_offset);

}  // namespace kiln
