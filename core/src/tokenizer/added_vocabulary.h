// Added tokens of a tokenizer.json ("added_tokens"): matched in the text before pre-tokenisation, leftmost
// and longest first, honouring lstrip / rstrip (absorb neighbouring whitespace), single_word (only between
// non-word characters) and normalized (matched against the normalized text instead of the raw input).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/status.h"

namespace kiln {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A run of text still to be tokenized (id < 0) or one matched added token.
struct TextSegment {
  std::string text;
  int32_t id = -1;
  bool special_tokens = true;  // whether special tokens may match in `text` (false: client text, see Tokenizer)
};

class AddedVocabulary {
 public:
  // `normalize` maps a token's content to what it is matched against when its `normalized` flag is set.
  template <class Normalize>
  static Result<AddedVocabulary> from_json(const nlohmann::json& json, const std::string& field, Normalize normalize);

  // Splits each text segment of `segments` around the tokens of one kind (normalized or not). Special tokens
  // are left in the text of segments whose special_tokens is false (Hugging Face's encode_special_tokens).
  void split(std::vector<TextSegment>& segments, bool normalized) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find(int32_t id) const;
  const AddedToken* find(std::string_view content) const;

 private:
  struct Matcher {
    // Patterns by first byte, longest first, as indexes into tokens_ with the string matched.
    std::vector<std::vector<std::pair<std::string, std::size_t>>> by_first_byte =
        std::vector<std::vector<std::pair<std::string, std::size_t>>>(256);
    void add(std::string pattern, std::size_t token_index);
    void finish();
  };
  static Result<AddedToken> parse(const nlohmann::json& entry, const std::string& field);
  void split_one(const TextSegment& segment, const Matcher& matcher, std::vector<TextSegment>& out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, std::size_t> by_id_;
  std::unordered_map<std::string, std::size_t> by_content_;
  Matcher raw_matcher_;
  Matcher normalized_matcher_;
};

template <class Normalize>
Result<AddedVocabulary> AddedVocabulary::from_json(const nlohmann::json& json, const std::string& field,
                                                   Normalize normalize) {
  AddedVocabulary vocabulary;
  if (json.is_null()) return vocabulary;
  if (!json.is_array()) return data_loss(field + ": expected an array");
  for (std::size_t i = 0; i < json.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(AddedToken token, parse(json[i], field + "[" + std::to_string(i) + "]"));
    const std::size_t index = vocabulary.tokens_.size();
    if (!token.content.empty()) {
      if (token.normalized) {
        vocabulary.normalized_matcher_.add(normalize(token.content), index);
      } else {
        vocabulary.raw_matcher_.add(token.content, index);
      }
    }
    vocabulary.by_id_[token.id] = index;
    vocabulary.by_content_[token.content] = index;
    vocabulary.tokens_.push_back(std::move(token));
  }
  vocabulary.raw_matcher_.finish();
  vocabulary.normalized_matcher_.finish();
  return vocabulary;
}

}  // namespace kiln
