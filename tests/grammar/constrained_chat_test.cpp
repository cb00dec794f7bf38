// Constrained decoding end to end: the server over the real engine and the embedded tiny model (models/tiny-glm, a
// 10 M model that writes nonsense), so it is the grammar alone that makes the answers valid. Every answer must parse
// and validate against its schema (nested objects, enums, arrays, required fields, bounded numbers and strings),
// forced tool calls must name a tool and carry schema-valid arguments, bad formats are 400s naming the field, and
// MTP drafting leaves constrained greedy output unchanged, token for token.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar/constrained_support.h"

namespace kiln::testing {
namespace {

TEST(ConstrainedChat, JsonSchemaAnswersValidateGreedyAndSampled) {
  TinyServer server;
  const std::vector<std::string> prompts = {"Describe a widget.", "Return a new list of the socket module"};
  for (const json& schema : test_schemas())
    for (const std::string& prompt : prompts) {
      auto [status, body] = server.chat(schema_request(schema, prompt));
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(content_problem(body, schema), "") << schema.dump();
      for (int seed : {1, 2}) {
        auto [s2, sampled] = server.chat(schema_request(schema, prompt, 1.0, seed));
        ASSERT_EQ(s2, 200) << sampled.dump();
        EXPECT_EQ(content_problem(sampled, schema), "") << schema.dump() << " seed " << seed;
      }
    }
}

TEST(ConstrainedChat, JsonObjectIsAnObject) {
  TinyServer server;
  json req = {{"messages", user("Give me a JSON object.")},
              {"chat_template_kwargs", kNoThinking},
              {"max_tokens", 400},
              {"temperature", 0},
              {"response_format", {{"type", "json_object"}}}};
  auto [status, body] = server.chat(req);
  ASSERT_EQ(status, 200) << body.dump();
  const json& choice = body["choices"][0];
  // The tiny model may write a string that outlasts max_tokens; what it wrote must still be a JSON object's prefix,
  // and a finished answer an object.
  const std::string content = choice["message"]["content"];
  ASSERT_FALSE(content.empty());
  EXPECT_EQ(content.find_first_not_of(" \n\t"), content.find('{')) << content;
  if (choice["finish_reason"] == "stop") {
    const json parsed = json::parse(content, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << content;
  }
}

TEST(ConstrainedChat, NamedToolChoiceGivesSchemaValidArguments) {
  TinyServer server;
  const json tools = weather_tools();
  for (const std::string name : {"get_weather", "set_alarm"})
    for (double temperature : {0.0, 1.0}) {
      json req = {{"messages", user("What is the weather in Paris?")},
                  {"chat_template_kwargs", kNoThinking},
                  {"max_tokens", 200},
                  {"temperature", temperature},
                  {"seed", 7},
                  {"tools", tools},
                  {"tool_choice", {{"type", "function"}, {"function", {{"name", name}}}}}};
      auto [status, body] = server.chat(req);
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(tool_call_problem(body, tools, name), "") << name << " at temperature " << temperature;
    }
}

TEST(ConstrainedChat, RequiredToolChoiceCallsOneOfTheTools) {
  TinyServer server;
  const json tools = weather_tools();
  for (int seed : {0, 1, 2}) {
    json req = {{"messages", user("Wake me at seven.")},
                {"chat_template_kwargs", kNoThinking},
                {"max_tokens", 200},
                {"temperature", seed == 0 ? 0.0 : 1.0},
                {"seed", seed},
                {"tools", tools},
                {"tool_choice", "required"},
                {"parallel_tool_calls", false}};  // one call (several: ConstrainedTools.RequiredParallelCalls…)
    auto [status, body] = server.chat(req);
    ASSERT_EQ(status, 200) << body.dump();
    EXPECT_EQ(tool_call_problem(body, tools, ""), "") << "seed " << seed;
  }
}

// 400 naming `param`, with `phrase` in the message.
void expect_refused(TinyServer& server, const json& req, const std::string& param, const std::string& phrase) {
  auto [status, body] = server.chat(req);
  EXPECT_EQ(status, 400) << body.dump();
  EXPECT_EQ(body["error"]["param"], param) << body.dump();
  EXPECT_NE(body["error"]["message"].get<std::string>().find(phrase), std::string::npos) << body.dump();
}

TEST(ConstrainedChat, BadFormatsAreRefusedNamingTheField) {
  TinyServer server;
  json base = {{"messages", user("hi")}, {"chat_template_kwargs", kNoThinking}, {"max_tokens", 8}};
  auto with = [&](json format) {
    json r = base;
    r["response_format"] = std::move(format);
    return r;
  };
  expect_refused(server, with("json"), "response_format", "must be an object");
  expect_refused(server, with({{"type", "yaml"}}), "response_format.type", "yaml");
  expect_refused(server, with({{"schema", json::object()}}), "response_format.type", "required");
  expect_refused(server, with({{"type", "json_schema"}}), "response_format.json_schema", "required");
  expect_refused(server, with({{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}),
                 "response_format.json_schema.schema", "required");
  expect_refused(server, with({{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", "object"}}}}),
                 "response_format.json_schema.schema", "JSON schema");
  expect_refused(server,
                 with({{"type", "json_schema"}, {"json_schema", {{"name", 3}, {"schema", {{"type", "object"}}}}}}),
                 "response_format.json_schema.name", "string");
  expect_refused(
      server, with({{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "object"}}}, {"strict", "yes"}}}}),
      "response_format.json_schema.strict", "boolean");
  // Schemas xgrammar cannot build: an unknown type, a reference to nothing, a minimum above the maximum.
  for (const char* bad : {R"({"type": "objekt"})", R"({"$ref": "#/$defs/missing"})",
                          R"({"type": "integer", "minimum": 5, "maximum": 1})"}) {
    expect_refused(server, with({{"type", "json_schema"}, {"json_schema", {{"schema", json::parse(bad)}}}}),
                   "response_format.json_schema.schema", "cannot be enforced");
  }
  // A forced tool call and a JSON answer at once.
  json both = with({{"type", "json_object"}});
  both["tools"] = weather_tools();
  both["tool_choice"] = "required";
  expect_refused(server, both, "response_format", "tool_choice");
  // A tool whose parameters no grammar can hold.
  json bad_tool = base;
  bad_tool["tools"] = json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}}}])");
  bad_tool["tool_choice"] = "required";
  expect_refused(server, bad_tool, "tools", "cannot be enforced");
  // The server still answers afterwards.
  auto [status, body] = server.chat(base);
  EXPECT_EQ(status, 200) << body.dump();
}

// MTP drafting verifies each draft against the mask of its own position: greedy constrained answers are the same
// tokens with and without drafting, and drafts are proposed and accepted along the way.
TEST(ConstrainedChat, MtpDraftingLeavesConstrainedGreedyOutputUnchanged) {
  std::vector<json> requests;
  for (const json& schema : test_schemas()) requests.push_back(schema_request(schema, "Describe a widget."));
  requests.push_back({{"messages", user("Weather?")},
                      {"chat_template_kwargs", kNoThinking},
                      {"max_tokens", 200},
                      {"temperature", 0},
                      {"tools", weather_tools()},
                      {"tool_choice", "required"}});
  requests.push_back({{"messages", user("Alarm")},
                      {"chat_template_kwargs", kNoThinking},
                      {"max_tokens", 200},
                      {"temperature", 0},
                      {"tools", weather_tools()},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "set_alarm"}}}}}});
  std::vector<json> plain, drafted;
  {
    TinyServer server;
    for (const json& r : requests) plain.push_back(server.chat(r).second);
  }
  TinyServer server(/*mtp_depth=*/3);
  for (const json& r : requests) drafted.push_back(server.chat(r).second);
  expect_same_messages(plain, drafted);
  if (HasFatalFailure()) return;
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(plain[i]["usage"]["completion_tokens"], drafted[i]["usage"]["completion_tokens"]) << "request " << i;
  const EngineMetrics m = server.metrics();
  EXPECT_GT(m.spec_draft_tokens, 0) << "nothing was drafted";
  EXPECT_GT(m.spec_accepted_tokens, 0) << "no draft was accepted";
  // Sampled with drafting (rejection sampling against the masked target): still valid answers every time.
  for (const json& schema : test_schemas())
    for (int seed : {4, 5, 6}) {
      auto [status, body] = server.chat(schema_request(schema, "Describe a widget.", 1.0, seed));
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(content_problem(body, schema), "") << schema.dump() << " seed " << seed;
    }
  json sampled_call = {{"messages", user("Alarm")},
                       {"chat_template_kwargs", kNoThinking},
                       {"max_tokens", 200},
                       {"temperature", 1.0},
                       {"seed", 8},
                       {"tools", weather_tools()},
                       {"tool_choice", "required"},
                       {"parallel_tool_calls", false}};
  auto [status, body] = server.chat(sampled_call);
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(tool_call_problem(body, weather_tools(), ""), "");
}

}  // namespace
}  // namespace kiln::testing
