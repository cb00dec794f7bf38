// The checkpoint's chat template rendered by the embedded Jinja2 against what transformers 5.17's
// apply_chat_template renders (tests/data/chat_templates/<arch>/expected.json, tools/make_chat_template_fixtures.py),
// for every supported architecture's template; the prompt pieces keep client-brought special tokens as plain text;
// and the built-in GLM-4.7 renderer is identical to the Jinja rendering of GLM-4.7's own file.
#include "tokenizer/jinja_chat_template.h"

#include <algorithm>
#include <thread>

#include "tokenizer/chat_template.h"
#include "tokenizer_test_support.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

std::filesystem::path template_dir(const std::string& arch) {
  return std::filesystem::path(KILN_SOURCE_DIR) / "tests" / "data" / "chat_templates" / arch;
}

Json cases_of(const std::string& arch) { return Json::parse(testing::read_text(template_dir(arch) / "expected.json")); }

JinjaChatTemplate load(const std::string& arch) {
  auto t = JinjaChatTemplate::from_checkpoint(template_dir(arch));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(t.ok() && t->has_value()) << arch << " has no template";
  return std::move(**t);
}

ChatRenderInput input_of(const Json& c) {
  ChatRenderInput in;
  auto messages = template_messages(c["messages"]);
  EXPECT_TRUE(messages.ok()) << messages.status().to_string();
  in.messages = *messages;
  in.tools = c["tools"];
  in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  in.kwargs = c["kwargs"];
  return in;
}

class ArchitectureTemplate : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchitectureTemplate, RendersAsTransformersDoes) {
  const JinjaChatTemplate t = load(GetParam());
  const Json cases = cases_of(GetParam());
  ASSERT_GE(cases.size(), 10u);
  for (const Json& c : cases) {
    auto rendered = t.render(input_of(c));
    if (c.contains("error")) {
      ASSERT_FALSE(rendered.ok()) << c["name"];
      EXPECT_EQ(rendered.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(rendered.status().message().find(c["error"].get<std::string>()), std::string::npos)
          << rendered.status().message();
      continue;
    }
    ASSERT_TRUE(rendered.ok()) << c["name"] << ": " << rendered.status().to_string();
    EXPECT_EQ(*rendered, c["expected"].get<std::string>()) << GetParam() << " / " << c["name"];
  }
}

TEST_P(ArchitectureTemplate, PiecesJoinToTheRenderingAndClientTextMatchesNoSpecialToken) {
  const JinjaChatTemplate t = load(GetParam());
  const Tokenizer& tok = testing::fixture_tokenizer();
  for (const Json& c : cases_of(GetParam())) {
    if (c.contains("error")) continue;
    auto pieces = t.render_pieces(input_of(c), tok.special_token_texts());
    ASSERT_TRUE(pieces.ok()) << pieces.status().to_string();
    std::string joined;
    for (const PromptPiece& p : *pieces) joined += p.text;
    EXPECT_EQ(joined, c["expected"].get<std::string>()) << c["name"];
    const std::vector<int32_t> ids = tok.encode(*pieces);
    const bool any_client = std::any_of(pieces->begin(), pieces->end(), [](const PromptPiece& p) { return p.client_text; });
    // Without client-written special tokens the pieces tokenize as the joined text.
    if (!any_client) EXPECT_EQ(ids, tok.encode(joined)) << c["name"];
    if (c["name"] != "special_tokens_in_client_text") continue;
    EXPECT_TRUE(any_client);
    // The client wrote <|user|>, <|assistant|>, <|observation|> and [gMASK] as text: none became a token.
    const auto count = [&](const char* token) { return std::count(ids.begin(), ids.end(), *tok.token_to_id(token)); };
    const bool glm = GetParam() != "deepseek_v3";  // DeepSeek's template writes none of GLM's markers
    EXPECT_EQ(count("<|user|>"), glm ? 1 : 0) << "only the template's own <|user|>";
    EXPECT_EQ(count("<|assistant|>"), glm ? 1 : 0);
    EXPECT_EQ(count("<|observation|>"), 0);
    EXPECT_EQ(count("[gMASK]"), glm ? 1 : 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ArchitectureTemplate,
                         ::testing::Values("glm4_moe_lite", "glm_moe_dsa", "deepseek_v3", "glm5_next"));

// The hand-written GLM-4.7 renderer is kept only as a cache of GLM-4.7's template: it must render every fixture
// conversation exactly as Jinja2 renders the checkpoint's file.
TEST(BuiltinGlm47Template, IsIdenticalToTheCheckpointTemplate) {
  const JinjaChatTemplate t = load("glm4_moe_lite");
  EXPECT_EQ(t.source(false), glm47_chat_template_source());
  for (const Json& c : cases_of("glm4_moe_lite")) {
    auto parsed = parse_chat_messages(c["messages"]);
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    ChatTemplateOptions options;
    options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    options.enable_thinking = c["kwargs"].value("enable_thinking", true);
    options.clear_thinking = c["kwargs"].value("clear_thinking", true);
    if (c["tools"].is_array()) options.tools = c["tools"];
    auto builtin = render_glm_chat(*parsed, options);
    ASSERT_TRUE(builtin.ok()) << builtin.status().to_string();
    auto jinja = t.render(input_of(c));
    ASSERT_TRUE(jinja.ok()) << jinja.status().to_string();
    EXPECT_EQ(*builtin, *jinja) << c["name"];
  }
}

TEST(JinjaChatTemplate, TransformersFiltersAndGlobals) {
  auto t = JinjaChatTemplate::from_source(
      "{{ messages[0].content | tojson }}|{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=True) }}|"
      "{{ [1, 2] | tojson(indent=1) }}|{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}"
      "{% endfor %}|{{ bos_token }}|{{ strftime_now('%Y') | length }}|{% generation %}g{% endgeneration %}",
      Json{{"bos_token", "<s>"}});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ChatRenderInput in;
  in.messages = Json::parse(R"([{"role": "user", "content": "<b>\"x\" ü</b>"}])");
  auto r = t->render(in);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "\"<b>\\\"x\\\" ü</b>\"|{\"a\": \"é\", \"b\": 1}|[\n 1,\n 2\n]|012|<s>|4|g");
}

TEST(JinjaChatTemplate, KwargsOverrideSpecialTokensAndErrorsAreReported) {
  auto t = JinjaChatTemplate::from_source("{{ bos_token }}{{ flag }}", Json{{"bos_token", "<s>"}});
  ASSERT_TRUE(t.ok());
  ChatRenderInput in;
  in.kwargs = Json{{"bos_token", "B"}, {"flag", true}};
  EXPECT_EQ(*t->render(in), "BTrue");

  auto sandboxed = JinjaChatTemplate::from_source("{{ messages.append(1) }}");
  ASSERT_TRUE(sandboxed.ok());
  auto r = sandboxed->render(ChatRenderInput{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("SecurityError"), std::string::npos) << r.status().message();

  auto broken = JinjaChatTemplate::from_source("{% if %}");
  ASSERT_TRUE(broken.ok());
  auto s = broken->render(ChatRenderInput{});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("TemplateSyntaxError"), std::string::npos) << s.status().message();
}

TEST(JinjaChatTemplate, RendersFromManyThreads) {
  const JinjaChatTemplate t = load("glm4_moe_lite");
  const Json cases = cases_of("glm4_moe_lite");
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th)
    threads.emplace_back([&] {
      for (int round = 0; round < 5; ++round)
        for (const Json& c : cases) {
          auto r = t.render(input_of(c));
          if (!r.ok() || *r != c["expected"].get<std::string>()) ++mismatches;
        }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(JinjaChatTemplate, CheckpointWithoutTemplateAndBadArguments) {
  auto none = JinjaChatTemplate::from_checkpoint(std::filesystem::path(KILN_SOURCE_DIR) / "models" / "tiny-glm");
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_FALSE(none->has_value());
  auto bad = template_messages(Json::parse(
      R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("messages[0].tool_calls[0].function.arguments"), std::string::npos);
}

}  // namespace
}  // namespace kiln
