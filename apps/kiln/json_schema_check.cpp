#include "json_schema_check.h"

#include <set>

namespace kiln::cli {
namespace {

using nlohmann::json;

std::string type_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

bool has_type(const json& v, const std::string& type) {
  const std::string t = type_of(v);
  // JSON Schema: 2.0 is an integer; every integer is a number.
  if (type == "integer")
    return t == "integer" || (t == "number" && v.get<double>() == static_cast<int64_t>(v.get<double>()));
  if (type == "number") return t == "integer" || t == "number";
  return t == type;
}

std::string check(const json& schema, const json& v, const std::string& at) {
  const std::string where = at.empty() ? "/" : at;
  if (schema.is_boolean()) return schema.get<bool>() ? "" : where + ": no value is allowed here";
  if (!schema.is_object()) return where + ": the schema is not an object";
  static const std::set<std::string> kKnown = {"type",     "properties",  "required",  "additionalProperties",
                                               "items",    "enum",        "const",     "minItems",
                                               "maxItems", "minLength",   "maxLength", "minimum",
                                               "maximum",  "description", "title",     "$schema"};
  for (const auto& [key, _] : schema.items())
    if (!kKnown.count(key)) return where + ": the schema uses `" + key + "`, which this checker does not implement";

  if (schema.contains("type")) {
    const json& t = schema["type"];
    bool ok = false;
    if (t.is_string()) ok = has_type(v, t.get<std::string>());
    for (const auto& one : t.is_array() ? t : json::array())
      ok = ok || (one.is_string() && has_type(v, one.get<std::string>()));
    if (!ok) return where + ": expected " + t.dump() + ", got " + type_of(v);
  }
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& e : schema["enum"]) found = found || e == v;
    if (!found) return where + ": " + v.dump() + " is not one of " + schema["enum"].dump();
  }
  if (schema.contains("const") && schema["const"] != v) return where + ": expected " + schema["const"].dump();
  if (v.is_number()) {
    if (schema.contains("minimum") && v.get<double>() < schema["minimum"].get<double>())
      return where + ": " + v.dump() + " is below the minimum " + schema["minimum"].dump();
    if (schema.contains("maximum") && v.get<double>() > schema["maximum"].get<double>())
      return where + ": " + v.dump() + " is above the maximum " + schema["maximum"].dump();
  }
  if (v.is_string()) {
    // Lengths count code points, as JSON Schema does, not bytes.
    size_t n = 0;
    for (unsigned char c : v.get_ref<const std::string&>()) n += (c & 0xC0) != 0x80;
    if (schema.contains("minLength") && n < schema["minLength"].get<size_t>())
      return where + ": string shorter than minLength";
    if (schema.contains("maxLength") && n > schema["maxLength"].get<size_t>())
      return where + ": string longer than maxLength";
  }
  if (v.is_array()) {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>())
      return where + ": " + std::to_string(v.size()) + " items, fewer than minItems " + schema["minItems"].dump();
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>())
      return where + ": " + std::to_string(v.size()) + " items, more than maxItems " + schema["maxItems"].dump();
    if (schema.contains("items"))
      for (size_t i = 0; i < v.size(); ++i)
        if (std::string e = check(schema["items"], v[i], at + "/" + std::to_string(i)); !e.empty()) return e;
  }
  if (v.is_object()) {
    const json props = schema.value("properties", json::object());
    for (const auto& r : schema.value("required", json::array()))
      if (!v.contains(r.get<std::string>()))
        return where + ": missing required property `" + r.get<std::string>() + "`";
    for (const auto& [key, value] : v.items()) {
      if (props.contains(key)) {
        if (std::string e = check(props[key], value, at + "/" + key); !e.empty()) return e;
      } else if (schema.contains("additionalProperties")) {
        if (std::string e = check(schema["additionalProperties"], value, at + "/" + key); !e.empty())
          return schema["additionalProperties"] == false ? where + ": unexpected property `" + key + "`" : e;
      }
    }
  }
  return "";
}

}  // namespace

std::string json_schema_violation(const nlohmann::json& schema, const nlohmann::json& value) {
  return check(schema, value, "");
}

}  // namespace kiln::cli
