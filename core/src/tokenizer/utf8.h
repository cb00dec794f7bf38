// UTF-8 helpers shared by the tokenizer, its decoders and the chat template.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::utf8 {

// Decodes the code point starting at text[pos] and sets `length` to its byte count. The input is assumed
// valid (tokenizer input is checked once by the caller); a stray byte decodes as itself with length 1.
char32_t decode_at(std::string_view text, std::size_t pos, std::size_t& length);

void append(std::string& out, char32_t code_point);

// Whether `text` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid(std::string_view bytes);

// Replaces every ill-formed subsequence by U+FFFD, one per maximal subpart, as Rust's
// String::from_utf8_lossy does (which is what Hugging Face tokenizers' decoders use).
std::string to_valid_lossy(std::string_view bytes);

// Number of trailing bytes that form a proper prefix of a well-formed sequence, i.e. bytes that may still
// become a character when more bytes arrive (0..3). A streaming decoder holds exactly these back.
std::size_t incomplete_tail_length(std::string_view bytes);

// Rust's char::is_whitespace (Unicode White_Space), used by added-token lstrip/rstrip.
bool is_unicode_whitespace(char32_t c);

}  // namespace kiln::utf8
