// Forced tool-call grammars over tiny-glm's tokenizer, without a model: DeepSeek-V3's format (named and
// "required"), one or more calls under "required" in both formats (each schema-valid, a bad second call refused,
// exactly one with parallel_tool_calls false), and a free reasoning prefix ending in </think> before a JSON answer
// or a call. tiny-glm has no DeepSeek special tokens, so its markup is spelled from ordinary tokens here; the
// parser reads the same text either way.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "grammar/tiny_grammar_support.h"
#include "server/deepseek_v3_tool_call_parser.h"
#include "server/tool_call_parser.h"

namespace kiln::testing {
namespace {

using ojson = nlohmann::ordered_json;
using P = DeepSeekV3ToolCallParser;

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"],
      "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}}])");

ToolCallGrammar deepseek_call(const std::string& name, bool parallel = true) {
  ToolCallGrammar call = glm_call(name, parallel);
  call.parser = "deepseek_v3";
  return call;
}

ReasoningPrefix reasoning(int64_t max_tokens = -1) {
  return {true, max_tokens};
}

std::string deepseek_whole_call(const std::string& name, const std::string& arguments) {
  return P::kCallBegin + "function" + P::kSep + name + "\n```json\n" + arguments + "\n```" + P::kCallEnd;
}

// Whether `text` is accepted whole, and the request may then end (a stop token is allowed).
bool accepted_to_the_end(Fixture& f, TokenConstraint& c, const std::string& text) {
  return feed(c, text) == tiny_tokenizer().encode(text).size() && token_allowed(mask_of(c).data(), f.stops[0]);
}

// The calls the deepseek_v3 parser reads from `text` generated after the prompt's `opening`.
std::vector<ParsedToolCall> parsed(const std::string& opening, const std::string& name, const std::string& text) {
  auto parser = make_tool_call_parser("deepseek_v3", kTools, [] { return std::string("call_1"); });
  if (!name.empty()) {
    parser->begin_call(name);
  } else {
    parser->feed(opening);
  }
  parser->feed(text);
  parser->flush();
  return parser->calls();
}

TEST(ToolCallGrammar, DeepSeekNamedCallTakesSchemaValidJsonAndTheParserReadsIt) {
  Fixture f;
  auto c = f.out.tool_calls(kTools, deepseek_call("get_weather"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const std::string args = R"({"city": "Paris", "days": 3})";
  const std::string text = args + "\n```" + P::kCallEnd + P::kCallsEnd;
  EXPECT_TRUE(accepted_to_the_end(f, **c, text));
  const auto calls = parsed("", "get_weather", text);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(ojson::parse(calls[0].arguments), ojson::parse(args));

  // A missing required property, or a property the schema does not have, cannot close the arguments.
  for (const std::string bad : {R"({"city": "Paris"})", R"({"city": "Paris", "days": 3, "x": 1})"}) {
    auto k = f.out.tool_calls(kTools, deepseek_call("get_weather"));
    ASSERT_TRUE(k.ok());
    const std::string attempt = bad + "\n```" + P::kCallEnd;
    EXPECT_LT(feed(**k, attempt), tiny_tokenizer().encode(attempt).size()) << bad;
  }
}

TEST(ToolCallGrammar, DeepSeekRequiredTakesOneOrMoreValidCalls) {
  Fixture f;
  const std::string weather = deepseek_whole_call("get_weather", R"({"city": "Oslo", "days": 2})");
  const std::string ping = deepseek_whole_call("ping", "{}");
  for (const std::string& calls : {weather, weather + ping, ping + weather + ping}) {
    auto c = f.out.tool_calls(kTools, deepseek_call(""));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_TRUE(accepted_to_the_end(f, **c, calls + P::kCallsEnd)) << calls;
  }
  const auto read = parsed(P::kCallsBegin, "", weather + ping + P::kCallsEnd);
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].name, "get_weather");
  EXPECT_EQ(read[1].name, "ping");

  // No call at all, an unknown function, or an invalid second call are refused.
  for (const std::string& bad : {P::kCallsEnd, deepseek_whole_call("nope", "{}"),
                                 weather + deepseek_whole_call("get_weather", R"({"city": 5, "days": 2})")}) {
    auto c = f.out.tool_calls(kTools, deepseek_call(""));
    ASSERT_TRUE(c.ok());
    EXPECT_LT(feed(**c, bad), tiny_tokenizer().encode(bad).size()) << bad;
  }
}

TEST(ToolCallGrammar, ParallelToolCallsFalseAllowsExactlyOneCall) {
  Fixture f;
  const std::string ping = deepseek_whole_call("ping", "{}");
  auto one = f.out.tool_calls(kTools, deepseek_call("", /*parallel=*/false));
  ASSERT_TRUE(one.ok());
  EXPECT_LT(feed(**one, ping + ping), tiny_tokenizer().encode(ping + ping).size());
  auto again = f.out.tool_calls(kTools, deepseek_call("", false));
  EXPECT_TRUE(accepted_to_the_end(f, **again, ping + P::kCallsEnd));

  // GLM: after the first </tool_call> the only way on is a stop token, not another <tool_call>.
  const int32_t open = *tiny_tokenizer().token_to_id("<tool_call>");
  auto glm_one = f.out.tool_calls(kTools, glm_call("", false));
  ASSERT_TRUE(glm_one.ok());
  ASSERT_TRUE(accepted_to_the_end(f, **glm_one, "ping</tool_call>"));
  EXPECT_FALSE(token_allowed(mask_of(**glm_one).data(), open));
  auto glm_many = f.out.tool_calls(kTools, glm_call(""));
  ASSERT_TRUE(accepted_to_the_end(f, **glm_many, "ping</tool_call>"));
  EXPECT_TRUE(token_allowed(mask_of(**glm_many).data(), open));
}

TEST(ToolCallGrammar, GlmRequiredTakesSeveralValidCallsAndRefusesAnInvalidOne) {
  Fixture f;
  const std::string weather =
      "get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value><arg_key>days</arg_key><arg_value>4"
      "</arg_value></tool_call>";
  auto c = f.out.tool_calls(kTools, glm_call(""));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(accepted_to_the_end(f, **c, weather + "<tool_call>ping</tool_call><tool_call>" + weather));
  // The second call's days is not an integer.
  const std::string bad = weather +
                          "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
                          "<arg_key>days</arg_key><arg_value>four</arg_value>";
  auto k = f.out.tool_calls(kTools, glm_call(""));
  EXPECT_LT(feed(**k, bad), tiny_tokenizer().encode(bad).size());
}

const ojson kSchema = ojson::parse(R"({"type": "object", "properties": {"n": {"type": "integer"}},
    "required": ["n"], "additionalProperties": false})");

TEST(ToolCallGrammar, ReasoningThenJsonAcceptsValidJsonOnly) {
  Fixture f;
  const std::string thought = "Let me think {not json} about </thin k> this.\n";
  auto c = f.out.json_schema(kSchema, true, reasoning());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // Reasoning cannot end the request: the answer must follow.
  ASSERT_EQ(feed(**c, thought), tiny_tokenizer().encode(thought).size());
  EXPECT_FALSE(token_allowed(mask_of(**c).data(), f.stops[0]));
  EXPECT_TRUE(accepted_to_the_end(f, **c, R"(</think>{"n": 7})"));

  for (const std::string bad : {R"(</think>{"n": "seven"})", R"(</think>{"m": 7})", "</think>n = 7"}) {
    auto k = f.out.json_schema(kSchema, true, reasoning());
    ASSERT_EQ(feed(**k, thought), tiny_tokenizer().encode(thought).size());
    EXPECT_LT(feed(**k, bad), tiny_tokenizer().encode(bad).size()) << bad;
  }
  auto object = f.out.json_object(reasoning());
  ASSERT_TRUE(object.ok());
  EXPECT_TRUE(accepted_to_the_end(f, **object, thought + R"(</think>{"any": [1]})"));
  // Without reasoning the same text is refused at once.
  auto plain = f.out.json_schema(kSchema, true);
  EXPECT_EQ(feed(**plain, thought), 0u);
}

TEST(ToolCallGrammar, ReasoningBudgetForcesTheEndOfThinking) {
  Fixture f;
  auto c = f.out.json_schema(kSchema, true, reasoning(/*max_tokens=*/3));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const std::vector<int32_t> words = tiny_tokenizer().encode("one two three four");
  ASSERT_GT(words.size(), 3u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.value()->accept(words[i]));
  const std::vector<uint32_t> m = mask_of(**c);
  EXPECT_FALSE(token_allowed(m.data(), words[3]));
  EXPECT_TRUE(token_allowed(m.data(), *tiny_tokenizer().token_to_id("</think>")));
  EXPECT_TRUE(accepted_to_the_end(f, **c, R"(</think>{"n": 1})"));
}

TEST(ToolCallGrammar, ReasoningThenAForcedCallWritesTheOpeningToo) {
  Fixture f;
  ToolCallGrammar glm = glm_call("get_weather");
  glm.reasoning = reasoning();
  auto c = f.out.tool_calls(kTools, glm);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(accepted_to_the_end(f, **c,
                                  "Weather, so.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo"
                                  "</arg_value><arg_key>days</arg_key><arg_value>1</arg_value></tool_call>"));
  auto wrong = f.out.tool_calls(kTools, glm);
  EXPECT_LT(feed(**wrong, "x</think>ping"), tiny_tokenizer().encode("x</think>ping").size());

  ToolCallGrammar deepseek = deepseek_call("");
  deepseek.reasoning = reasoning();
  auto d = f.out.tool_calls(kTools, deepseek);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::string calls = P::kCallsBegin + deepseek_whole_call("ping", "{}") + P::kCallsEnd;
  EXPECT_TRUE(accepted_to_the_end(f, **d, "Hm.</think>" + calls));
  EXPECT_EQ(parsed("", "", calls).size(), 1u);
}

TEST(ToolCallGrammar, UnknownNamesAndParsersAreRefused) {
  Fixture f;
  EXPECT_FALSE(f.out.tool_calls(kTools, deepseek_call("nope")).ok());
  ToolCallGrammar other = glm_call("");
  other.parser = "hermes";
  EXPECT_FALSE(f.out.tool_calls(kTools, other).ok());
}

}  // namespace
}  // namespace kiln::testing
