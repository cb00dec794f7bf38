// What the grammar tests over tiny-glm's tokenizer share (no model): a StructuredOutput with tiny-glm's stop
// tokens, the mask a constraint gives, and feeding text to a constraint token by token as the engine would.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/model_step.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace kiln::testing {

inline const Tokenizer& tiny_tokenizer() {
  static const Tokenizer t = [] {
    auto loaded = Tokenizer::load(std::filesystem::path(KILN_SOURCE_DIR) / "models/tiny-glm/tokenizer.json");
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    return std::move(loaded).value();
  }();
  return t;
}

inline constexpr int64_t kVocab = 4096;  // tiny-glm's logits (its tokenizer has 4096 ids too)

struct Fixture {
  std::vector<int32_t> stops = {*tiny_tokenizer().token_to_id("<|user|>"),
                                *tiny_tokenizer().token_to_id("<|observation|>")};
  StructuredOutput out{tiny_tokenizer(), kVocab, stops};
};

inline std::vector<uint32_t> mask_of(TokenConstraint& c) {
  std::vector<uint32_t> m(token_mask_words(kVocab));
  c.fill_allowed(m);
  return m;
}

// Feeds `text` token by token, each checked against the mask first; returns how many were accepted.
inline size_t feed(TokenConstraint& c, const std::string& text) {
  const std::vector<int32_t> ids = tiny_tokenizer().encode(text);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!token_allowed(mask_of(c).data(), ids[i]) || !c.accept(ids[i])) return i;
  }
  return ids.size();
}

// A forced GLM call (named, or "required" when `name` is empty).
inline ToolCallGrammar glm_call(const std::string& name, bool parallel = true) {
  ToolCallGrammar call;
  call.parser = "glm47";
  call.name = name;
  call.parallel = parallel;
  return call;
}

}  // namespace kiln::testing
