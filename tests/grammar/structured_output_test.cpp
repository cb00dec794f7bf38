// StructuredOutput over the tiny model's tokenizer, without a model: the masks a grammar gives, accepting and
// rolling back, completion on a stop token, GLM tool-call text the tool parser reads, and schemas refused with a
// reason.
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar/tiny_grammar_support.h"
#include "server/glm_tool_call_parser.h"

namespace kiln::testing {
namespace {

using ojson = nlohmann::ordered_json;

TEST(StructuredOutput, SchemaTextIsAcceptedAndOnlyAStopTokenEndsIt) {
  Fixture f;
  auto c = f.out.json_schema(ojson::parse(R"({"type": "object", "properties": {
      "color": {"type": "string", "enum": ["red", "blue"]}, "n": {"type": "integer"}},
      "required": ["color", "n"], "additionalProperties": false})"),
                             true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  TokenConstraint& k = **c;
  const std::string text = R"({"color": "red", "n": 42})";
  EXPECT_EQ(feed(k, text), tiny_tokenizer().encode(text).size());
  EXPECT_FALSE(k.terminated());
  // Complete: a stop token and nothing that would continue the text (a digit could still extend nothing here).
  const std::vector<uint32_t> m = mask_of(k);
  EXPECT_TRUE(token_allowed(m.data(), f.stops[0]));
  EXPECT_TRUE(token_allowed(m.data(), f.stops[1]));
  EXPECT_FALSE(token_allowed(m.data(), tiny_tokenizer().encode("}")[0]));
  EXPECT_FALSE(token_allowed(m.data(), *tiny_tokenizer().token_to_id("<|endoftext|>")));  // not a stop token here
  EXPECT_TRUE(k.accept(f.stops[0]));
  EXPECT_TRUE(k.terminated());
}

TEST(StructuredOutput, RefusedTokensLeaveTheStateAndRollbackRestoresIt) {
  Fixture f;
  auto c = f.out.json_schema(ojson::parse(R"({"type": "object", "properties": {"a": {"type": "boolean"}},
      "required": ["a"], "additionalProperties": false})"),
                             true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  TokenConstraint& k = **c;
  const std::vector<uint32_t> initial = mask_of(k);
  const std::vector<int32_t> word = tiny_tokenizer().encode("hello");
  EXPECT_FALSE(token_allowed(initial.data(), word[0]));
  EXPECT_FALSE(k.accept(word[0]));
  EXPECT_EQ(mask_of(k), initial);
  const std::vector<int32_t> ids = tiny_tokenizer().encode(R"({"a": tr)");
  for (int32_t id : ids) ASSERT_TRUE(k.accept(id));
  EXPECT_NE(mask_of(k), initial);
  k.rollback(static_cast<int>(ids.size()));
  EXPECT_EQ(mask_of(k), initial);
  // Special tokens outside the grammar's markup are never allowed, nor ids past the tokenizer's vocabulary.
  EXPECT_FALSE(token_allowed(initial.data(), *tiny_tokenizer().token_to_id("<|assistant|>")));
  EXPECT_FALSE(token_allowed(initial.data(), *tiny_tokenizer().token_to_id("<think>")));
}

// JSON forbids raw control characters in strings; xgrammar's string rule admits all but \r and \n. Inside a free
// string (the state where the grammar allows the most), no token holding a control byte other than \n and \r may
// be allowed, for json_schema and json_object alike; ordinary text tokens still are.
TEST(StructuredOutput, JsonStringsNeverTakeControlCharacters) {
  Fixture f;
  auto schema = f.out.json_schema(ojson::parse(R"({"type": "object", "properties": {"s": {"type": "string"}},
      "required": ["s"], "additionalProperties": false})"),
                                  true);
  auto object = f.out.json_object();
  ASSERT_TRUE(schema.ok() && object.ok());
  ASSERT_EQ(feed(**schema, R"({"s": "ab)"), tiny_tokenizer().encode(R"({"s": "ab)").size());
  ASSERT_EQ(feed(**object, R"({"k": "ab)"), tiny_tokenizer().encode(R"({"k": "ab)").size());
  int control_tokens = 0;
  for (TokenConstraint* c : {&**schema, &**object}) {
    const std::vector<uint32_t> m = mask_of(*c);
    int allowed_text = 0;
    for (int32_t id = 0; id < static_cast<int32_t>(tiny_tokenizer().vocab_size()); ++id) {
      if (tiny_tokenizer().is_special(id)) continue;
      const std::string bytes = tiny_tokenizer().token_bytes(id);
      bool control = false;
      for (unsigned char b : bytes) control = control || (b < 0x20 && b != '\n' && b != '\r');
      if (control) {
        ++control_tokens;
        EXPECT_FALSE(token_allowed(m.data(), id)) << "token " << id << " holds a control byte";
      } else if (token_allowed(m.data(), id)) {
        ++allowed_text;
      }
    }
    EXPECT_GT(allowed_text, 100) << "a free string still takes ordinary text";
  }
  EXPECT_GT(control_tokens, 0) << "the byte-level vocabulary has tokens for control bytes";
}

TEST(StructuredOutput, JsonObjectAcceptsObjectsOnly) {
  Fixture f;
  auto c = f.out.json_object();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(token_allowed(mask_of(**c).data(), tiny_tokenizer().encode("[")[0]));
  const std::string text = R"({"x": [1, {"y": null}], "z": "w"})";
  EXPECT_EQ(feed(**c, text), tiny_tokenizer().encode(text).size());
}

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}}},
  {"type": "function", "function": {"name": "ping"}}])");

TEST(StructuredOutput, GlmToolCallsParseToSchemaValidArguments) {
  Fixture f;
  auto named = f.out.tool_calls(kTools, glm_call("get_weather"));
  ASSERT_TRUE(named.ok()) << named.status().to_string();
  const std::string args =
      "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3"
      "</arg_value></tool_call>";
  EXPECT_EQ(feed(**named, args), tiny_tokenizer().encode(args).size());
  EXPECT_TRUE(token_allowed(mask_of(**named).data(), f.stops[1]));
  // What the grammar allows is what the tool parser turns into arguments.
  GlmToolCallParser parser(kTools, [] { return std::string("call_1"); });
  parser.begin_call("get_weather");
  parser.feed(args);
  parser.flush();
  ASSERT_EQ(parser.calls().size(), 1u);
  EXPECT_EQ(ojson::parse(parser.calls()[0].arguments), ojson::parse(R"({"city": "Paris", "days": 3})"));

  // A missing required argument cannot close the call.
  auto short_call = f.out.tool_calls(kTools, glm_call("get_weather"));
  ASSERT_TRUE(short_call.ok());
  const std::string partial = "<arg_key>city</arg_key><arg_value>Paris</arg_value>";
  ASSERT_EQ(feed(**short_call, partial), tiny_tokenizer().encode(partial).size());
  EXPECT_FALSE(token_allowed(mask_of(**short_call).data(), *tiny_tokenizer().token_to_id("</tool_call>")));

  // "required": the name comes first, one of the tools'.
  auto any = f.out.tool_calls(kTools, glm_call(""));
  ASSERT_TRUE(any.ok()) << any.status().to_string();
  EXPECT_FALSE(token_allowed(mask_of(**any).data(), tiny_tokenizer().encode("x")[0]));
  const std::string ping = "ping</tool_call>";
  EXPECT_EQ(feed(**any, ping), tiny_tokenizer().encode(ping).size());
}

TEST(StructuredOutput, UnusableSchemasAreRefusedWithAReason) {
  Fixture f;
  for (const char* bad : {R"({"type": "objekt"})", R"({"$ref": "#/$defs/missing"})",
                          R"({"type": "integer", "minimum": 5, "maximum": 1})"}) {
    auto c = f.out.json_schema(ojson::parse(bad), true);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(c.status().message().empty());
    // The reason, not xgrammar's log prefix (time, source file and line).
    EXPECT_EQ(c.status().message().find(".cc:"), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message()[0], '[') << c.status().message();
  }
  EXPECT_FALSE(f.out.tool_calls(kTools, glm_call("nope")).ok());
}

}  // namespace
}  // namespace kiln::testing
