#include "tokenizer/python_json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln {
namespace {

void dump_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buffer;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

// Python's float repr: shortest round-trip digits; exponent form when exp < -4 or >= 16, written "1e+16".
void dump_float(double v, std::string& out) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "Infinity" : "-Infinity";
    return;
  }
  char digits[32];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(digits, sizeof(digits), "%.*e", precision - 1, v);
    if (std::strtod(digits, nullptr) == v) break;
  }
  // digits = "[-]d.ddde[+-]XX"
  std::string mantissa(digits, std::strchr(digits, 'e'));
  const int exponent = std::atoi(std::strchr(digits, 'e') + 1);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string significant;
  for (char c : mantissa) {
    if (c != '.') significant.push_back(c);
  }
  while (significant.size() > 1 && significant.back() == '0') significant.pop_back();
  if (negative) out.push_back('-');
  if (exponent < -4 || exponent >= 16) {
    out += significant.substr(0, 1);
    if (significant.size() > 1) out += "." + significant.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += e;
  } else if (exponent < 0) {
    out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + significant;
  } else {
    const auto int_digits = static_cast<std::size_t>(exponent) + 1;
    if (significant.size() <= int_digits) {
      out += significant + std::string(int_digits - significant.size(), '0') + ".0";
    } else {
      out += significant.substr(0, int_digits) + "." + significant.substr(int_digits);
    }
  }
}

void dump(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      out += "null";
      break;
    case nlohmann::json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case nlohmann::json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case nlohmann::json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case nlohmann::json::value_t::number_float:
      dump_float(v.get<double>(), out);
      break;
    case nlohmann::json::value_t::string:
      dump_string(v.get_ref<const std::string&>(), out);
      break;
    case nlohmann::json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dump(item, out);
      }
      out.push_back(']');
      break;
    }
    case nlohmann::json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        dump_string(key, out);
        out += ": ";
        dump(item, out);
      }
      out.push_back('}');
      break;
    }
    default:
      out += "null";
      break;  // binary / discarded values never come from parsed JSON
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace kiln
