// Typed reads of config.json fields the way transformers' strict configs take them; shared by every
// architecture's config parser so their errors read alike.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln {

// Reads typed fields of one JSON object; every error names the source file and the field's path.
// transformers rejects a wrong JSON type for a declared field (e.g. "hidden_size": "64"), and so do we;
// the one leniency is accepting an integer literal where a float is expected.
class FieldReader {
  using json = nlohmann::json;

 public:
  FieldReader(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool present(const char* key) const { return object_.contains(key); }
  bool is_null(const char* key) const { return present(key) && object_.at(key).is_null(); }
  const json& at(const char* key) const { return object_.at(key); }

  Status type_error(const char* key, const char* expected) const {
    const json& v = object_.at(key);
    return invalid_argument(source_ + ": field '" + prefix_ + key + "' must be " + expected + ", got " + v.type_name() +
                            " " + v.dump());
  }
  Status value_error(const char* key, const std::string& why) const {
    return invalid_argument(source_ + ": field '" + prefix_ + key + "' " + why);
  }

  // Leaves `out` (the class default) alone when the key is absent.
  Status read(const char* key, int64_t& out) const {
    if (!present(key)) return ok_status();
    const json& v = at(key);
    if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
      out = v.get<int64_t>();
      return ok_status();
    }
    return type_error(key, "an integer");
  }
  Status read(const char* key, double& out) const {
    if (!present(key)) return ok_status();
    if (!at(key).is_number()) return type_error(key, "a number");
    out = at(key).get<double>();
    return ok_status();
  }
  Status read(const char* key, bool& out) const {
    if (!present(key)) return ok_status();
    if (!at(key).is_boolean()) return type_error(key, "true or false");
    out = at(key).get<bool>();
    return ok_status();
  }
  Status read(const char* key, std::string& out) const {
    if (!present(key)) return ok_status();
    if (!at(key).is_string()) return type_error(key, "a string");
    out = at(key).get<std::string>();
    return ok_status();
  }
  // int | null; null clears.
  Status read(const char* key, std::optional<int64_t>& out) const {
    if (!present(key)) return ok_status();
    if (is_null(key)) {
      out.reset();
      return ok_status();
    }
    int64_t v = 0;
    if (!at(key).is_number_integer()) return type_error(key, "an integer or null");
    KILN_RETURN_IF_ERROR(read(key, v));
    out = v;
    return ok_status();
  }
  // number | null; null clears.
  Status read(const char* key, std::optional<double>& out) const {
    if (!present(key)) return ok_status();
    if (is_null(key)) {
      out.reset();
      return ok_status();
    }
    if (!at(key).is_number()) return type_error(key, "a number or null");
    out = at(key).get<double>();
    return ok_status();
  }
  // int | list of int | null.
  Status read_id_list(const char* key, std::vector<int64_t>& out) const {
    if (!present(key)) return ok_status();
    const json& v = at(key);
    out.clear();
    if (v.is_null()) return ok_status();
    if (v.is_number_integer()) {
      out.push_back(v.get<int64_t>());
      return ok_status();
    }
    if (!v.is_array()) return type_error(key, "an integer, a list of integers or null");
    for (const json& item : v) {
      if (!item.is_number_integer()) return type_error(key, "an integer, a list of integers or null");
      out.push_back(item.get<int64_t>());
    }
    return ok_status();
  }
  // A list of strings each from `allowed`; absent → nullopt.
  Result<std::optional<std::vector<std::string>>> read_choices(const char* key,
                                                               std::initializer_list<const char*> allowed) const {
    if (!present(key) || is_null(key)) return std::optional<std::vector<std::string>>();
    const json& v = at(key);
    std::string expected = "a list of strings from {";
    for (const char* a : allowed) expected += std::string(expected.back() == '{' ? "" : ", ") + a;
    expected += "}";
    if (!v.is_array()) return type_error(key, expected.c_str());
    std::vector<std::string> out;
    for (const json& item : v) {
      const bool ok = item.is_string() && std::any_of(allowed.begin(), allowed.end(),
                                                      [&](const char* a) { return item.get<std::string>() == a; });
      if (!ok) return value_error(key, "must be " + expected + ", got element " + item.dump());
      out.push_back(item.get<std::string>());
    }
    return std::optional<std::vector<std::string>>(std::move(out));
  }

  // Reads `out` from the first key present, then lets later aliases override it: transformers applies
  // attribute_map aliases (e.g. num_local_experts → n_routed_experts) after the canonical field.
  template <class T>
  Status read_aliased(std::initializer_list<const char*> keys, T& out) const {
    for (const char* key : keys) KILN_RETURN_IF_ERROR(read(key, out));
    return ok_status();
  }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

}  // namespace kiln
