// GPT-2's byte-level alphabet: every byte is shown as one printable code point so that BPE runs on text
// without ever splitting a byte. Printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in order.
#pragma once

#include <string>
#include <string_view>

namespace kiln::byte_level {

// The pattern Hugging Face's ByteLevel pre-tokenizer splits with when use_regex is true (GPT-2's).
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Each byte of `bytes` replaced by the UTF-8 encoding of its alphabet code point.
std::string encode(std::string_view bytes);

// Appends the bytes a vocabulary token stands for. A token containing a code point outside the alphabet
// (an added token such as "a b") is appended unchanged, as Hugging Face's ByteLevel decoder does.
void decode_token(std::string_view token, std::string& out);

}  // namespace kiln::byte_level
