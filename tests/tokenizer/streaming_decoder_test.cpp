#include "tokenizer/streaming_decoder.h"

#include "tokenizer/utf8.h"
#include "tokenizer_test_support.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

// Feeds `ids` one at a time; every chunk must be valid UTF-8.
std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special = false) {
  StreamingDecoder decoder(tok, skip_special);
  std::string text;
  for (int32_t id : ids) {
    const std::string chunk = decoder.feed(id);
    EXPECT_TRUE(utf8::is_valid(chunk));
    text += chunk;
  }
  text += decoder.flush();
  EXPECT_EQ(decoder.pending_bytes(), 0u);
  return text;
}

TEST(StreamingDecoder, ConcatenationEqualsDecodeOverTheCorpus) {
  const Tokenizer& tok = testing::fixture_tokenizer();
  const Json ref = testing::read_json("reference.json");
  for (const Json& c : ref["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(stream(tok, ids), tok.decode(ids)) << c["text"];
    EXPECT_EQ(stream(tok, ids, true), tok.decode(ids, true)) << c["text"];
  }
  for (const Json& c : ref["random_decodes"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(stream(tok, ids), c["decoded"].get<std::string>()) << c["ids"].dump();
  }
}

TEST(StreamingDecoder, HoldsBackASplitCharacterUntilComplete) {
  const Tokenizer& tok = testing::fixture_tokenizer();
  // "中" (E4 B8 AD) has no merges in the small vocabulary: one byte token per UTF-8 byte.
  const std::vector<int32_t> ids = tok.encode("中");
  ASSERT_EQ(ids.size(), 3u);
  StreamingDecoder decoder(tok);
  EXPECT_EQ(decoder.feed(ids[0]), "");
  EXPECT_EQ(decoder.pending_bytes(), 1u);
  EXPECT_EQ(decoder.feed(ids[1]), "");
  EXPECT_EQ(decoder.pending_bytes(), 2u);
  EXPECT_EQ(decoder.feed(ids[2]), "中");
  EXPECT_EQ(decoder.pending_bytes(), 0u);
  EXPECT_EQ(decoder.flush(), "");
}

TEST(StreamingDecoder, FlushReplacesAnIncompleteCharacter) {
  const Tokenizer& tok = testing::fixture_tokenizer();
  const std::vector<int32_t> ids = tok.encode("a中");
  StreamingDecoder decoder(tok);
  std::string text;
  for (std::size_t i = 0; i + 1 < ids.size(); ++i) text += decoder.feed(ids[i]);
  EXPECT_EQ(text, "a");
  EXPECT_EQ(decoder.flush(), "\xEF\xBF\xBD");
}

TEST(StreamingDecoder, SkipsSpecialTokensWhenAsked) {
  const Tokenizer& tok = testing::fixture_tokenizer();
  const std::vector<int32_t> ids = tok.encode("<|assistant|>hi<|user|>");
  EXPECT_EQ(stream(tok, ids, true), "hi");
  EXPECT_EQ(stream(tok, ids, false), "<|assistant|>hi<|user|>");
}

TEST(Utf8, IncompleteTailAndLossyConversion) {
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xE4\xB8"), 2u);
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xE0\x80"), 0u);  // E0 80 can never become a character
  EXPECT_EQ(utf8::incomplete_tail_length("\xBF"), 0u);
  EXPECT_EQ(utf8::to_valid_lossy("a\xE4\xB8"
                                 "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(utf8::to_valid_lossy("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::to_valid_lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace kiln
