// The C++ tokenizer against the ids and text Hugging Face `tokenizers` produced for the same fixture.
#include <algorithm>
#include <thread>
#include <vector>

#include "tokenizer_test_support.h"

namespace kiln {
namespace {

using testing::fixture_tokenizer;
using testing::read_json;
using Json = nlohmann::ordered_json;

std::vector<int32_t> ids_of(const Json& j) {
  return j.get<std::vector<int32_t>>();
}

TEST(TokenizerReference, VocabularyAndSpecialTokens) {
  const Tokenizer& tok = fixture_tokenizer();
  const Json ref = read_json("reference.json");
  EXPECT_EQ(tok.vocab_size(), ref["vocab_size"].get<int64_t>());
  for (const auto& [content, id] : ref["special_tokens"].items()) {
    EXPECT_EQ(tok.token_to_id(content), id.get<int32_t>()) << content;
    EXPECT_EQ(tok.id_to_token(id.get<int32_t>()), content);
    EXPECT_TRUE(tok.is_special(id.get<int32_t>())) << content;
  }
  const auto the = tok.token_to_id("Ġthe");
  ASSERT_TRUE(the.has_value());
  EXPECT_FALSE(tok.is_special(*the));
  EXPECT_EQ(tok.id_to_token(*the), "Ġthe");
  EXPECT_FALSE(tok.token_to_id("no such token").has_value());
  EXPECT_EQ(tok.id_to_token(-1), "");
  EXPECT_EQ(tok.id_to_token(1 << 20), "");
}

TEST(TokenizerReference, EncodeAndDecodeMatchHuggingFace) {
  const Tokenizer& tok = fixture_tokenizer();
  const Json ref = read_json("reference.json");
  ASSERT_GT(ref["cases"].size(), 80u);
  for (const Json& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    EXPECT_EQ(tok.encode(text), ids) << "text: " << text;
    EXPECT_EQ(tok.encode(text, /*parse_special=*/false), ids_of(c["ids_no_special"])) << "text: " << text;
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << "text: " << text;
    EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), c["decoded_skip_special"].get<std::string>()) << text;
  }
}

TEST(TokenizerReference, DecodeOfArbitraryIdsMatchesHuggingFace) {
  const Tokenizer& tok = fixture_tokenizer();
  const Json ref = read_json("reference.json");  // a range-for over a temporary's member would dangle
  for (const Json& c : ref["random_decodes"]) {
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>()) << c["ids"].dump();
  }
}

TEST(TokenizerReference, SpecialTokenParsingCanBeTurnedOff) {
  const Tokenizer& tok = fixture_tokenizer();
  const int32_t user = *tok.token_to_id("<|user|>");
  const std::vector<int32_t> parsed = tok.encode("a<|user|>b");
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), user), 1);
  const std::vector<int32_t> literal = tok.encode("a<|user|>b", /*parse_special=*/false);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), user), 0);
  EXPECT_GT(literal.size(), parsed.size());
  EXPECT_EQ(tok.decode(literal), "a<|user|>b");
  EXPECT_EQ(tok.decode(parsed, /*skip_special=*/true), "ab");
}

TEST(TokenizerReference, UnknownIdsAreSkippedWhenDecoding) {
  const Tokenizer& tok = fixture_tokenizer();
  const std::vector<int32_t> ids = tok.encode("hello");
  std::vector<int32_t> with_unknown = {-5, 1 << 24};
  with_unknown.insert(with_unknown.end(), ids.begin(), ids.end());
  EXPECT_EQ(tok.decode(with_unknown), "hello");
}

TEST(TokenizerReference, InvalidUtf8InputIsReplaced) {
  const Tokenizer& tok = fixture_tokenizer();
  EXPECT_EQ(tok.decode(tok.encode("ab\xFF"
                                  "cd")),
            "ab\xEF\xBF\xBD"
            "cd");
}

// Every variant drops some merges and applies a JSON merge patch to the fixture (a feature the base file
// lacks), then compares with what `tokenizers` produced for the modified file.
TEST(TokenizerReference, VariantsMatchHuggingFace) {
  const std::string base_text = testing::read_text(testing::tokenizer_data_dir() / "tokenizer.json");
  const Json ref = read_json("reference.json");
  ASSERT_GE(ref["variants"].size(), 10u);
  for (const Json& variant : ref["variants"]) {
    const std::string name = variant["name"].get<std::string>();
    nlohmann::json patched = nlohmann::json::parse(base_text);
    auto& merges = patched["model"]["merges"];
    for (const Json& dropped : variant["drop_merges"]) {
      const auto it = std::find(merges.begin(), merges.end(), nlohmann::json(dropped));
      ASSERT_NE(it, merges.end()) << name;
      merges.erase(it);
    }
    patched.merge_patch(nlohmann::json(variant["patch"]));
    auto tok = Tokenizer::from_json_text(patched.dump(), name);
    ASSERT_TRUE(tok.ok()) << name << ": " << tok.status().to_string();
    for (const Json& c : variant["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const std::vector<int32_t> ids = ids_of(c["ids"]);
      EXPECT_EQ(tok->encode(text), ids) << name << " text: " << text;
      EXPECT_EQ(tok->encode(text, false), ids_of(c["ids_no_special"])) << name << " text: " << text;
      EXPECT_EQ(tok->decode(ids), c["decoded"].get<std::string>()) << name << " text: " << text;
    }
  }
}

TEST(TokenizerReference, MergesInStringFormGiveTheSameIds) {
  const std::string base_text = testing::read_text(testing::tokenizer_data_dir() / "tokenizer.json");
  nlohmann::json json = nlohmann::json::parse(base_text);
  ASSERT_TRUE(json["model"]["merges"][0].is_array());
  for (auto& merge : json["model"]["merges"]) merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  auto tok = Tokenizer::from_json_text(json.dump(), "string-merges");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const Json ref = read_json("reference.json");
  for (const Json& c : ref["cases"]) {
    EXPECT_EQ(tok->encode(c["text"].get<std::string>()), ids_of(c["ids"])) << c["text"];
  }
}

TEST(TokenizerReference, ConcurrentEncodesAgree) {
  const Tokenizer& tok = fixture_tokenizer();
  const Json ref = read_json("reference.json");
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (const Json& c : ref["cases"]) {
          if (tok.encode(c["text"].get<std::string>()) != ids_of(c["ids"])) ++mismatches[t];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace kiln
