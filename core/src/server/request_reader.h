// Typed access to the optional fields of a JSON request body. The first wrong field is remembered as a 400
// naming it (param = the field), so a route reads everything it needs and checks ok() once.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"

namespace kiln {

// Parses a request body; malformed JSON becomes a 400 that names the byte position of the fault.
bool parse_json_body(const std::string& body, nlohmann::ordered_json* out, ApiError* error);

class RequestReader {
 public:
  explicit RequestReader(const nlohmann::ordered_json& body) : body_(body) {}

  // Each returns nullopt when the field is absent or null (and on a type/range error, which is recorded).
  std::optional<double> number(const char* key, double min, double max);
  std::optional<int64_t> integer(const char* key, int64_t min, int64_t max);
  std::optional<bool> boolean(const char* key);
  std::optional<std::string> string(const char* key);
  // A string or a list of strings (OpenAI's `stop`).
  std::optional<std::vector<std::string>> string_or_list(const char* key, size_t max_items);
  // The raw value, or nullptr when absent/null.
  const nlohmann::ordered_json* value(const char* key) const;

  void fail(ApiError error) {
    if (!error_) error_ = std::move(error);
  }
  bool ok() const { return !error_.has_value(); }
  const ApiError& error() const { return *error_; }

 private:
  const nlohmann::ordered_json& body_;
  std::optional<ApiError> error_;
};

// object[key] when it is a string; `fallback` when it is absent or null; nullopt when it is anything else (where
// nlohmann's value(key, default) would throw, and the client would get a 500 for its own mistake).
std::optional<std::string> string_member(const nlohmann::ordered_json& object, const char* key,
                                         const std::string& fallback = "");

// "a string", "an object", ... for messages that say what was sent instead.
std::string json_type_phrase(const nlohmann::ordered_json& v);

}  // namespace kiln
