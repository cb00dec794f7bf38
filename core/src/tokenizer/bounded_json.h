// Parsing JSON that comes from outside the process (request bodies, tool-call arguments, model output) with a
// bound on its nesting. nlohmann's parser is iterative, but copying, comparing and serialising a value (and the
// chat template's JSON writer) recurse once per level, so a value nested 20,000 deep overflows the stack of
// whichever thread touches it later, far from where it was read.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kiln {

// Deeper than any tool schema or arguments object a client sends, shallow enough for every recursive walk.
inline constexpr int kMaxJsonNesting = 128;

// Parses all of `text` into `out`. On failure returns false with `error` set: nlohmann's message for malformed
// JSON (it may quote a partial UTF-8 sequence: serialise it with error_handler_t::replace), or one naming the
// nesting limit.
bool parse_bounded_json(std::string_view text, nlohmann::ordered_json& out, std::string& error);
// The same into an unordered value (files such as tokenizer.json, whose readers recurse into nested entries).
bool parse_bounded_json(std::string_view text, nlohmann::json& out, std::string& error);

}  // namespace kiln
