#include "tokenizer/added_vocabulary.h"

#include <utf8proc.h>

#include <algorithm>

#include "tokenizer/utf8.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

// Rust's char::is_alphanumeric approximated by the general categories L* and N*, plus '_' (what Hugging Face
// treats as a word character for single_word tokens).
bool is_word_character(char32_t c) {
  if (c == U'_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// The code point that ends text[0, end).
char32_t code_point_before(std::string_view text, std::size_t end) {
  std::size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  std::size_t length = 1;
  return utf8::decode_at(text, begin, length);
}

}  // namespace

Result<AddedToken> AddedVocabulary::parse(const Json& entry, const std::string& field) {
  if (!entry.is_object()) return data_loss(field + ": expected an object");
  if (!entry.contains("id") || !entry["id"].is_number_integer() || entry["id"].get<int64_t>() < 0 ||
      entry["id"].get<int64_t>() > INT32_MAX) {
    return data_loss(field + ".id: missing or not a non-negative 32-bit integer");
  }
  if (!entry.contains("content") || !entry["content"].is_string()) {
    return data_loss(field + ".content: missing or not a string");
  }
  AddedToken token;
  token.id = static_cast<int32_t>(entry["id"].get<int64_t>());
  token.content = entry["content"].get<std::string>();
  auto flag = [&](const char* key, bool fallback) {
    return entry.contains(key) && entry[key].is_boolean() ? entry[key].get<bool>() : fallback;
  };
  token.special = flag("special", false);
  token.lstrip = flag("lstrip", false);
  token.rstrip = flag("rstrip", false);
  token.single_word = flag("single_word", false);
  token.normalized = flag("normalized", !token.special);
  return token;
}

void AddedVocabulary::Matcher::add(std::string pattern, std::size_t token_index) {
  const auto first = static_cast<unsigned char>(pattern[0]);
  by_first_byte[first].emplace_back(std::move(pattern), token_index);
}

void AddedVocabulary::Matcher::finish() {
  for (auto& bucket : by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
}

const AddedToken* AddedVocabulary::find(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

void AddedVocabulary::split(std::vector<TextSegment>& segments, bool normalized) const {
  const Matcher& matcher = normalized ? normalized_matcher_ : raw_matcher_;
  std::vector<TextSegment> out;
  out.reserve(segments.size());
  for (TextSegment& segment : segments) {
    if (segment.id >= 0) {
      out.push_back(std::move(segment));
    } else {
      split_one(segment, matcher, out);
    }
  }
  segments.swap(out);
}

// Scans like a leftmost-longest Aho-Corasick iterator: a match that is then rejected (single_word, or a
// special token where special tokens are off) still consumes its bytes, as in Hugging Face.
void AddedVocabulary::split_one(const TextSegment& segment, const Matcher& matcher,
                                std::vector<TextSegment>& out) const {
  const std::string& text = segment.text;
  const bool parse_special = segment.special_tokens;
  std::size_t emitted = 0;  // text before this offset has been emitted
  std::size_t scan = 0;
  while (scan < text.size()) {
    const auto& bucket = matcher.by_first_byte[static_cast<unsigned char>(text[scan])];
    const std::pair<std::string, std::size_t>* hit = nullptr;
    for (const auto& candidate : bucket) {
      if (text.compare(scan, candidate.first.size(), candidate.first) == 0) {
        hit = &candidate;
        break;
      }
    }
    if (hit == nullptr) {
      ++scan;
      continue;
    }
    const AddedToken& token = tokens_[hit->second];
    std::size_t start = scan;
    std::size_t stop = scan + hit->first.size();
    scan = stop;
    if (token.special && !parse_special) continue;
    if (token.single_word) {
      const bool word_before = start > 0 && is_word_character(code_point_before(text, start));
      std::size_t length = 1;
      const bool word_after = stop < text.size() && is_word_character(utf8::decode_at(text, stop, length));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      std::size_t new_start = start;
      while (new_start > 0) {
        std::size_t begin = new_start - 1;
        while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
        std::size_t length = 1;
        if (!utf8::is_unicode_whitespace(utf8::decode_at(text, begin, length))) break;
        new_start = begin;
      }
      start = std::max(new_start, emitted);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        std::size_t length = 1;
        if (!utf8::is_unicode_whitespace(utf8::decode_at(text, stop, length))) break;
        stop += length;
      }
      scan = stop;
    }
    if (emitted < start) out.push_back({text.substr(emitted, start - emitted), -1, parse_special});
    out.push_back({text.substr(start, stop - start), token.id, parse_special});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1, parse_special});
}

}  // namespace kiln
