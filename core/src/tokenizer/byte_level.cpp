#include "tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "tokenizer/utf8.h"

namespace kiln::byte_level {
namespace {

struct Alphabet {
  std::array<char32_t, 256> code_point_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  std::array<int16_t, 512> byte_of_code_point{};  // alphabet code points are all below U+0200; -1 = not one

  Alphabet() {
    byte_of_code_point.fill(-1);
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
      code_point_of_byte[b] = cp;
      utf8::append(utf8_of_byte[b], cp);
      byte_of_code_point[cp] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet kAlphabet;
  return kAlphabet;
}

}  // namespace

std::string encode(std::string_view bytes) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += a.utf8_of_byte[static_cast<unsigned char>(c)];
  return out;
}

void decode_token(std::string_view token, std::string& out) {
  const Alphabet& a = alphabet();
  const std::size_t start = out.size();
  for (std::size_t pos = 0; pos < token.size();) {
    std::size_t length = 1;
    const char32_t cp = utf8::decode_at(token, pos, length);
    if (cp >= a.byte_of_code_point.size() || a.byte_of_code_point[cp] < 0) {
      out.resize(start);
      out.append(token);
      return;
    }
    out.push_back(static_cast<char>(a.byte_of_code_point[cp]));
    pos += length;
  }
}

}  // namespace kiln::byte_level
