#include "server/request_reader.h"

#include <cmath>

#include "tokenizer/bounded_json.h"

namespace kiln {

bool parse_json_body(const std::string& body, nlohmann::ordered_json* out, ApiError* error) {
  std::string why;
  if (!parse_bounded_json(body, *out, why)) {
    // nlohmann's message names the line and column where parsing stopped.
    *error = bad_request("request body is not valid JSON: " + why, "body");
    error->code = "invalid_json";
    return false;
  }
  if (!out->is_object()) {
    *error = bad_request("request body must be a JSON object, got " + json_type_phrase(*out), "body");
    return false;
  }
  return true;
}

std::optional<std::string> string_member(const nlohmann::ordered_json& object, const char* key,
                                         const std::string& fallback) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::string json_type_phrase(const nlohmann::ordered_json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

const nlohmann::ordered_json* RequestReader::value(const char* key) const {
  auto it = body_.find(key);
  if (it == body_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> RequestReader::number(const char* key, double min, double max) {
  const auto* v = value(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) {
    fail(bad_request(std::string("'") + key + "' must be a number, got " + json_type_phrase(*v), key));
    return std::nullopt;
  }
  double x = v->get<double>();
  if (!std::isfinite(x) || x < min || x > max) {
    fail(bad_request(std::string("'") + key + "' must be between " + nlohmann::json(min).dump() + " and " +
                         nlohmann::json(max).dump() + ", got " + v->dump(),
                     key));
    return std::nullopt;
  }
  return x;
}

std::optional<int64_t> RequestReader::integer(const char* key, int64_t min, int64_t max) {
  const auto* v = value(key);
  if (!v) return std::nullopt;
  // 5.0 is accepted as 5 (some clients serialise every number as a float); 5.5 is not.
  bool integral = v->is_number_integer() || v->is_number_unsigned() ||
                  (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>());
  if (!integral) {
    fail(bad_request(std::string("'") + key + "' must be an integer, got " + json_type_phrase(*v), key));
    return std::nullopt;
  }
  // 2^63 is the first double past INT64_MAX; converting one at or beyond it would be undefined behaviour.
  constexpr double kTwoTo63 = 9223372036854775808.0;
  const bool too_large = v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                         : v->is_number_float()  ? !(std::fabs(v->get<double>()) < kTwoTo63)
                                                 : false;
  if (too_large) {
    fail(bad_request(std::string("'") + key + "' is out of range: " + v->dump(), key));
    return std::nullopt;
  }
  int64_t x = v->is_number_float() ? static_cast<int64_t>(v->get<double>()) : v->get<int64_t>();
  if (x < min || x > max) {
    fail(bad_request(std::string("'") + key + "' must be between " + std::to_string(min) + " and " +
                         std::to_string(max) + ", got " + std::to_string(x),
                     key));
    return std::nullopt;
  }
  return x;
}

std::optional<bool> RequestReader::boolean(const char* key) {
  const auto* v = value(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) {
    fail(bad_request(std::string("'") + key + "' must be a boolean, got " + json_type_phrase(*v), key));
    return std::nullopt;
  }
  return v->get<bool>();
}

std::optional<std::string> RequestReader::string(const char* key) {
  const auto* v = value(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    fail(bad_request(std::string("'") + key + "' must be a string, got " + json_type_phrase(*v), key));
    return std::nullopt;
  }
  return v->get<std::string>();
}

std::optional<std::vector<std::string>> RequestReader::string_or_list(const char* key, size_t max_items) {
  const auto* v = value(key);
  if (!v) return std::nullopt;
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) {
        fail(bad_request(
            std::string("'") + key + "[" + std::to_string(i) + "]' must be a string, got " + json_type_phrase((*v)[i]),
            key));
        return std::nullopt;
      }
      out.push_back((*v)[i].get<std::string>());
    }
  } else {
    fail(bad_request(std::string("'") + key + "' must be a string or a list of strings, got " + json_type_phrase(*v),
                     key));
    return std::nullopt;
  }
  if (out.size() > max_items) {
    fail(bad_request(std::string("'") + key + "' may hold at most " + std::to_string(max_items) + " entries", key));
    return std::nullopt;
  }
  for (const auto& s : out) {
    if (s.empty()) {
      fail(bad_request(std::string("'") + key + "' entries must not be empty", key));
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace kiln
