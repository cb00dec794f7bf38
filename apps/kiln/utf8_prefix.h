// Cutting model text for cards and manifests: a byte cut can split a UTF-8 character, and a string holding half a
// character is no longer valid UTF-8 (nlohmann::json refuses to serialise it).
#pragma once

#include <string>

namespace kiln::cli {

// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
inline std::string utf8_prefix(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // s[n] continues a character: back off
  return s.substr(0, n);
}

}  // namespace kiln::cli
