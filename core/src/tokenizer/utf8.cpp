#include "tokenizer/utf8.h"

namespace kiln::utf8 {
namespace {

// For a lead byte: how many continuation bytes follow and the valid range of the first one
// (Unicode Table 3-7, "Well-Formed UTF-8 Byte Sequences"). Returns false for bytes that cannot start one.
bool lead_info(unsigned char b, int& continuation, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    continuation = 1;
  } else if (b == 0xE0) {
    continuation = 2, lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    continuation = 2;
  } else if (b == 0xED) {
    continuation = 2, hi = 0x9F;
  } else if (b == 0xF0) {
    continuation = 3, lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    continuation = 3;
  } else if (b == 0xF4) {
    continuation = 3, hi = 0x8F;
  } else {
    return false;
  }
  return true;
}

// Length of the well-formed sequence at `pos` (>0), or minus the length of its maximal ill-formed subpart.
// `truncated` is set when the subpart is ill-formed only because the input ended.
int sequence_at(std::string_view bytes, std::size_t pos, bool& truncated) {
  truncated = false;
  const auto b = static_cast<unsigned char>(bytes[pos]);
  if (b < 0x80) return 1;
  int continuation = 0;
  unsigned char lo = 0, hi = 0;
  if (!lead_info(b, continuation, lo, hi)) return -1;
  for (int i = 1; i <= continuation; ++i) {
    if (pos + i >= bytes.size()) {
      truncated = true;
      return -i;
    }
    const auto c = static_cast<unsigned char>(bytes[pos + i]);
    if (c < lo || c > hi) return -i;
    lo = 0x80;
    hi = 0xBF;
  }
  return continuation + 1;
}

}  // namespace

char32_t decode_at(std::string_view text, std::size_t pos, std::size_t& length) {
  const auto b = static_cast<unsigned char>(text[pos]);
  int extra = 0;
  char32_t cp = b;
  if (b >= 0xF0) {
    extra = 3, cp = b & 0x07;
  } else if (b >= 0xE0) {
    extra = 2, cp = b & 0x0F;
  } else if (b >= 0xC0) {
    extra = 1, cp = b & 0x1F;
  }
  if (pos + extra >= text.size()) {
    length = 1;
    return b;
  }
  for (int i = 1; i <= extra; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  length = static_cast<std::size_t>(extra) + 1;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid(std::string_view bytes) {
  for (std::size_t pos = 0; pos < bytes.size();) {
    bool truncated = false;
    const int n = sequence_at(bytes, pos, truncated);
    if (n < 0) return false;
    pos += static_cast<std::size_t>(n);
  }
  return true;
}

std::string to_valid_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t pos = 0; pos < bytes.size();) {
    bool truncated = false;
    const int n = sequence_at(bytes, pos, truncated);
    if (n > 0) {
      out.append(bytes.substr(pos, static_cast<std::size_t>(n)));
      pos += static_cast<std::size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");
      pos += static_cast<std::size_t>(-n);
    }
  }
  return out;
}

std::size_t incomplete_tail_length(std::string_view bytes) {
  // A lead byte at most 3 bytes from the end whose sequence is cut only by the end of input.
  const std::size_t first = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (std::size_t pos = bytes.size(); pos > first; --pos) {
    const auto b = static_cast<unsigned char>(bytes[pos - 1]);
    if (b < 0x80) return 0;
    if (b >= 0xC0) {
      bool truncated = false;
      const int n = sequence_at(bytes, pos - 1, truncated);
      return (n < 0 && truncated) ? bytes.size() - (pos - 1) : 0;
    }
  }
  return 0;
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace kiln::utf8
