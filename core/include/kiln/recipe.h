// A plugin's view of its own recipe section, and the schema with which it declares the keys it owns.
// Header-only on purpose: plugins read their settings without linking a TOML parser.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/status.h"

namespace kiln {

enum class ValueType { kString, kInteger, kFloat, kBool, kStringTable };

inline const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kString: return "string";
    case ValueType::kInteger: return "integer";
    case ValueType::kFloat: return "float";
    case ValueType::kBool: return "boolean";
    case ValueType::kStringTable: return "table of strings";
  }
  return "?";
}

using StringTable = std::map<std::string, std::string>;
using RecipeValue = std::variant<std::string, int64_t, double, bool, StringTable>;

// One key a section owner accepts: its type, its default (absent = required or optional without
// default, see `required`), the allowed values for enumerations, and a line of documentation.
struct KeySpec {
  std::string name;
  ValueType type = ValueType::kString;
  std::optional<RecipeValue> default_value;
  std::string doc;
  bool required = false;
  std::vector<std::string> allowed;  // for strings: the closed set of valid values (empty = any)
  std::optional<double> min, max;    // for numbers: inclusive bounds
  bool is_path = false;              // relative paths resolve against the recipe file that set them
};

struct SectionSchema {
  std::vector<KeySpec> keys;
  const KeySpec* find(const std::string& key) const {
    for (const auto& k : keys)
      if (k.name == key) return &k;
    return nullptr;
  }
};

// The resolved settings of one recipe section (after `extends`, --set overrides and defaults),
// each value with the place it came from so a plugin's error can name it.
class RecipeSection {
 public:
  RecipeSection() = default;
  explicit RecipeSection(std::string name) : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  void set(const std::string& key, RecipeValue v, std::string origin = "default") {
    values_[key] = std::move(v);
    origins_[key] = std::move(origin);
  }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  const std::map<std::string, RecipeValue>& values() const { return values_; }

  // "configs/x.toml:12" for a value read from a file, "--set" for an override, "default" otherwise.
  std::string origin(const std::string& key) const {
    auto it = origins_.find(key);
    return it == origins_.end() ? "" : it->second;
  }

  std::string get_string(const std::string& key, std::string fallback = "") const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    if (auto* s = std::get_if<std::string>(&it->second)) return *s;
    return fallback;
  }
  int64_t get_int(const std::string& key, int64_t fallback = 0) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    if (auto* i = std::get_if<int64_t>(&it->second)) return *i;
    return fallback;
  }
  double get_float(const std::string& key, double fallback = 0.0) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    if (auto* d = std::get_if<double>(&it->second)) return *d;
    if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
    return fallback;
  }
  bool get_bool(const std::string& key, bool fallback = false) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    if (auto* b = std::get_if<bool>(&it->second)) return *b;
    return fallback;
  }
  StringTable get_table(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end()) return {};
    if (auto* t = std::get_if<StringTable>(&it->second)) return *t;
    return {};
  }

  // An error about one key, naming the section, key and where its value came from.
  Status error(const std::string& key, const std::string& what) const {
    std::string where = origin(key);
    return invalid_argument("`" + name_ + "." + key + "`" + (where.empty() ? "" : " (" + where + ")") + ": " + what);
  }

 private:
  std::string name_;
  std::map<std::string, RecipeValue> values_;
  std::map<std::string, std::string> origins_;
};

}  // namespace kiln
