// A bound on how deep a recipe's keys nest, checked on the text before toml++ reads it: toml++ limits nested values
// (arrays, inline tables) to 256 but not dotted keys or table headers, and it recurses once per part — a header
// `[a.a.a…]` of 50,000 parts overflowed the stack of `kiln recipe check` (a segfault, not an error).
#pragma once

#include <string>
#include <string_view>

#include "kiln/status.h"

namespace kiln {

// Deeper than any recipe key (section.key, or a plugin's section.sub.key), far below what overflows a stack.
inline constexpr int kMaxRecipeKeyParts = 64;

// OK, or an error naming `source`, the line and the limit when a table header or a key before `=` has more than
// kMaxRecipeKeyParts dot-separated parts. Strings (basic, literal, multi-line) are skipped; values are not looked at.
Status check_toml_key_depth(std::string_view text, const std::string& source);

}  // namespace kiln
