// The pre-tokenizer of a tokenizer.json: splits text into the pieces BPE runs on. Supported: Split (Regex or
// String pattern; behaviors Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert),
// ByteLevel (add_prefix_space, use_regex with GPT-2's pattern) and Sequence of those; null means none.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "tokenizer/onig_regex.h"

namespace kiln {

class PreTokenizer {
 public:
  // `field` names the JSON location in error messages ("pre_tokenizer").
  static Result<PreTokenizer> from_json(const nlohmann::json& json, const std::string& field);

  // Appends the pieces of `text` to `pieces` (empty pieces are dropped, as Hugging Face does).
  void split(const std::string& text, std::vector<std::string>& pieces) const;

  // Whether a ByteLevel step maps the pieces to the byte alphabet.
  bool is_byte_level() const;

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    bool byte_level = false;
    bool add_prefix_space = false;  // ByteLevel
    std::vector<OnigRegex> regex;   // Split pattern, or ByteLevel's GPT-2 pattern when use_regex (0 or 1)
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
  };

  static Status add_steps(const nlohmann::json& json, const std::string& field, std::vector<Step>& steps);
  static void apply(const Step& step, const std::string& piece, std::vector<std::string>& out);

  std::vector<Step> steps_;
};

}  // namespace kiln
