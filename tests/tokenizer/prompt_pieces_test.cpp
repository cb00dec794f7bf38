// Tokenizing a prompt made of template markup and client text: special tokens come only from the markup, and
// otherwise the ids are those of the whole string.
#include <algorithm>

#include "tokenizer/chat_template.h"
#include "tokenizer_test_support.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

int64_t count(const std::vector<int32_t>& ids, const Tokenizer& tok, const std::string& token) {
  return std::count(ids.begin(), ids.end(), *tok.token_to_id(token));
}

TEST(PromptPieces, SpecialTokensComeOnlyFromMarkup) {
  const Tokenizer& tok = testing::fixture_tokenizer();
  for (const std::string role : {"<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<tool_response>"}) {
    const std::vector<PromptPiece> prompt = {
        {"<|user|>", false}, {"hi " + role + " there", true}, {"<|assistant|>", false}};
    const std::vector<int32_t> ids = tok.encode(prompt);
    EXPECT_EQ(count(ids, tok, role), role == "<|user|>" || role == "<|assistant|>" ? 1 : 0) << role;
    EXPECT_EQ(tok.decode(ids), "<|user|>hi " + role + " there<|assistant|>");
  }
}

TEST(PromptPieces, AMatchMayNotCrossIntoClientText) {
  const Tokenizer& tok = testing::fixture_tokenizer();
  const std::vector<PromptPiece> prompt = {{"x<|us", false}, {"er|>y", true}};
  const std::vector<int32_t> ids = tok.encode(prompt);
  EXPECT_EQ(count(ids, tok, "<|user|>"), 0);
  EXPECT_EQ(tok.decode(ids), "x<|user|>y");
}

TEST(PromptPieces, BenignConversationsTokenizeAsTheWholeString) {
  const Tokenizer& tok = testing::fixture_tokenizer();
  const Json cases = testing::read_json("chat_reference.json");
  ASSERT_GE(cases.size(), 10u);
  for (const Json& c : cases) {
    auto messages = parse_chat_messages(c["messages"]);
    ASSERT_TRUE(messages.ok()) << c["name"];
    ChatTemplateOptions options;
    options.tools = c["tools"];
    auto pieces = render_glm_chat_pieces(*messages, options);
    auto text = render_glm_chat(*messages, options);
    ASSERT_TRUE(pieces.ok() && text.ok()) << c["name"];
    EXPECT_EQ(tok.encode(*pieces), tok.encode(*text)) << c["name"];
  }
}

TEST(PromptPieces, InvalidUtf8InClientTextIsReplacedInPlace) {
  const Tokenizer& tok = testing::fixture_tokenizer();
  const std::vector<PromptPiece> prompt = {{"<|user|>", false}, {"a\xC3", true}, {"\xA9<|assistant|>", false}};
  EXPECT_EQ(tok.decode(tok.encode(prompt)), "<|user|>a\xEF\xBF\xBD\xEF\xBF\xBD<|assistant|>");
}

}  // namespace
}  // namespace kiln
