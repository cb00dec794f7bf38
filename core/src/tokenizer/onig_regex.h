// A compiled Oniguruma regular expression. Hugging Face tokenizers compiles its pre-tokenizer patterns with
// Oniguruma, so using the same engine (same syntax, same Unicode classes) keeps the splits identical.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/status.h"

namespace kiln {

class OnigRegex {
 public:
  // `pattern` in Oniguruma's default syntax, UTF-8.
  static Result<OnigRegex> compile(std::string_view pattern);
  // A regex matching `literal` exactly (every metacharacter escaped).
  static Result<OnigRegex> compile_literal(std::string_view literal);

  // Non-overlapping matches as [begin, end) byte offsets, left to right. An empty match right after the
  // previous match is skipped (and the scan advances one character) so the scan always terminates.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

 private:
  struct Compiled;
  explicit OnigRegex(std::shared_ptr<const Compiled> compiled) : compiled_(std::move(compiled)) {}
  std::shared_ptr<const Compiled> compiled_;
};

}  // namespace kiln
