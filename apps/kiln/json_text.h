#pragma once
// JSON as text for kiln's files and transcripts. Strings in them can come from a model's output or a server's reply,
// which may end inside a UTF-8 sequence; nlohmann's default dump throws on those, so bad bytes become U+FFFD here.
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::cli {

// Any nlohmann JSON type as it is: an ordered_json converted to json would come out with its keys sorted.
template <class Json>
std::string json_text(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace kiln::cli
