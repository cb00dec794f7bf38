#pragma once
// JSON as text for kiln's files and transcripts. Strings in them can come from a model's output or a server's reply,
// which may end inside a UTF-8 sequence; nlohmann's default dump throws on those, so bad bytes become U+FFFD here.
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::cli {

inline std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kiln::cli
