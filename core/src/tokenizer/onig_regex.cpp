#include "tokenizer/onig_regex.h"

#include <oniguruma.h>

#include <mutex>

#include "tokenizer/utf8.h"

namespace kiln {
namespace {

void initialize_oniguruma_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

struct RegionDeleter {
  void operator()(OnigRegion* region) const { onig_region_free(region, 1); }
};

}  // namespace

struct OnigRegex::Compiled {
  regex_t* regex = nullptr;
  ~Compiled() {
    if (regex != nullptr) onig_free(regex);
  }
};

Result<OnigRegex> OnigRegex::compile(std::string_view pattern) {
  initialize_oniguruma_once();
  auto compiled = std::make_shared<Compiled>();
  OnigErrorInfo error_info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&compiled->regex, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_DEFAULT, &error_info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &error_info);
    compiled->regex = nullptr;
    return invalid_argument("cannot compile regex '" + std::string(pattern) +
                            "': " + reinterpret_cast<const char*>(message));
  }
  return OnigRegex(std::move(compiled));
}

Result<OnigRegex> OnigRegex::compile_literal(std::string_view literal) {
  std::string escaped;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    const bool plain = u >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!plain) escaped.push_back('\\');
    escaped.push_back(c);
  }
  return compile(escaped);
}

std::vector<std::pair<std::size_t, std::size_t>> OnigRegex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  std::unique_ptr<OnigRegion, RegionDeleter> region(onig_region_new());
  const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = begin + text.size();
  std::size_t position = 0;
  bool have_previous = false;
  std::size_t previous_end = 0;
  while (position <= text.size()) {
    const int found = onig_search(compiled_->regex, begin, end, begin + position, end, region.get(), ONIG_OPTION_NONE);
    if (found < 0) break;
    const auto match_begin = static_cast<std::size_t>(region->beg[0]);
    const auto match_end = static_cast<std::size_t>(region->end[0]);
    if (match_begin == match_end && have_previous && previous_end == match_end) {
      std::size_t length = 1;
      if (position < text.size()) utf8::decode_at(text, position, length);
      position += length;
      continue;
    }
    matches.emplace_back(match_begin, match_end);
    position = match_end;
    previous_end = match_end;
    have_previous = true;
  }
  return matches;
}

}  // namespace kiln
