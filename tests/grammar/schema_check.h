// A JSON-schema check for the keywords the grammar tests use (type, properties, required, additionalProperties,
// enum, const, items, minItems/maxItems, minimum/maximum, minLength/maxLength): the tests assert the constrained
// output against it independently of the grammar engine. Returns "" when `value` is valid, else the first problem.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kiln::testing {

inline std::string schema_problem(const nlohmann::json& value, const nlohmann::json& schema,
                                  const std::string& at = "$") {
  using nlohmann::json;
  if (schema.contains("enum")) {
    bool found = false;
    for (const json& e : schema["enum"]) found = found || e == value;
    if (!found) return at + ": " + value.dump() + " is not in the enum";
  }
  if (schema.contains("const") && schema["const"] != value) return at + ": not the const";
  if (!schema.contains("type")) return "";
  const std::string type = schema["type"];
  if (type == "object") {
    if (!value.is_object()) return at + ": not an object";
    const json props = schema.value("properties", json::object());
    for (const json& r : schema.value("required", json::array()))
      if (!value.contains(r.get<std::string>())) return at + ": missing required " + r.get<std::string>();
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!props.contains(it.key())) {
        if (schema.value("additionalProperties", true) == false) return at + ": unexpected property " + it.key();
        continue;
      }
      if (std::string p = schema_problem(it.value(), props[it.key()], at + "." + it.key()); !p.empty()) return p;
    }
    return "";
  }
  if (type == "array") {
    if (!value.is_array()) return at + ": not an array";
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) return at + ": too few items";
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) return at + ": too many items";
    if (schema.contains("items"))
      for (size_t i = 0; i < value.size(); ++i)
        if (std::string p = schema_problem(value[i], schema["items"], at + "[" + std::to_string(i) + "]"); !p.empty())
          return p;
    return "";
  }
  if (type == "string") {
    if (!value.is_string()) return at + ": not a string";
    // Lengths in code points, as JSON schema counts them.
    size_t n = 0;
    for (unsigned char c : value.get<std::string>()) n += (c & 0xC0) != 0x80;
    if (schema.contains("minLength") && n < schema["minLength"].get<size_t>()) return at + ": too short";
    if (schema.contains("maxLength") && n > schema["maxLength"].get<size_t>()) return at + ": too long";
    return "";
  }
  if (type == "integer" || type == "number") {
    if (type == "integer" ? !value.is_number_integer() : !value.is_number()) return at + ": not a " + type;
    const double v = value.get<double>();
    if (schema.contains("minimum") && v < schema["minimum"].get<double>()) return at + ": below minimum";
    if (schema.contains("maximum") && v > schema["maximum"].get<double>()) return at + ": above maximum";
    return "";
  }
  if (type == "boolean") return value.is_boolean() ? "" : at + ": not a boolean";
  if (type == "null") return value.is_null() ? "" : at + ": not null";
  return at + ": the test's checker does not know type " + type;
}

}  // namespace kiln::testing
