// Forced tool calls in the DeepSeek-V3 format, parallel calls, and reasoning before a constrained answer, end to
// end: the server over the real engine and tiny-glm (a 10 M model that writes nonsense, so only the grammar makes
// the answers valid). tiny-glm's tokenizer has no DeepSeek special tokens: the grammar spells the markup from
// ordinary tokens, and the deepseek_v3 parser reads the same text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar/constrained_support.h"

namespace kiln::testing {
namespace {

json forced(const json& tool_choice, double temperature, int seed, bool thinking = false) {
  json req = {{"messages", user("Wake me at seven, and what is the weather in Oslo?")},
              {"max_tokens", 300},
              {"temperature", temperature},
              {"seed", seed},
              {"tools", weather_tools()},
              {"tool_choice", tool_choice}};
  if (!thinking) req["chat_template_kwargs"] = kNoThinking;
  return req;
}

const json kNamedAlarm = {{"type", "function"}, {"function", {{"name", "set_alarm"}}}};

// The prompt rendered by DeepSeek-V3's own chat template (the fixture's), tools and all. One call per request:
// under that prompt tiny-glm keeps calling until max_tokens when it may (RequiredParallelCallsAreEachValid covers
// several calls).
const std::filesystem::path kDeepSeekTemplate =
    std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/chat_templates/deepseek_v3";

TEST(ConstrainedTools, DeepSeekForcedCallsGiveSchemaValidArguments) {
  TinyServer server(0, false, "deepseek_v3", kDeepSeekTemplate);
  for (const json& choice : {json("required"), kNamedAlarm})
    for (int seed : {0, 1, 2}) {
      json req = forced(choice, seed == 0 ? 0.0 : 1.0, seed);
      req["parallel_tool_calls"] = false;
      auto [status, body] = server.chat(req);
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(tool_call_problem(body, weather_tools(), choice.is_object() ? "set_alarm" : ""), "")
          << choice.dump() << " seed " << seed;
      // The markup never leaks into the content.
      const json& content = body["choices"][0]["message"]["content"];
      EXPECT_TRUE(content.is_null() || content == "") << body.dump();
    }
}

TEST(ConstrainedTools, DeepSeekStreamedCallsAddUpToValidArguments) {
  TinyServer server(0, false, "deepseek_v3", kDeepSeekTemplate);
  for (const json& choice : {json("required"), kNamedAlarm}) {
    json req = forced(choice, 1.0, 4);
    req["parallel_tool_calls"] = false;
    auto [status, events] = server.chat_stream(req);
    ASSERT_EQ(status, 200);
    std::vector<std::string> names, arguments;
    std::string finish;
    for (const json& e : events) {
      ASSERT_FALSE(e.is_discarded());
      if (!e.contains("choices") || e["choices"].empty()) continue;
      const json& c = e["choices"][0];
      if (c["finish_reason"].is_string()) finish = c["finish_reason"];
      if (!c["delta"].contains("tool_calls")) continue;
      for (const json& d : c["delta"]["tool_calls"]) {
        const size_t i = d["index"];
        if (i >= names.size()) names.resize(i + 1), arguments.resize(i + 1);
        if (d["function"].contains("name")) names[i] = d["function"]["name"];
        arguments[i] += d["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_EQ(finish, "tool_calls");
    ASSERT_FALSE(names.empty()) << choice.dump();
    json calls = json::array();
    for (size_t i = 0; i < names.size(); ++i)
      calls.push_back({{"function", {{"name", names[i]}, {"arguments", arguments[i]}}}});
    const json as_body = {{"choices", {{{"finish_reason", finish}, {"message", {{"tool_calls", calls}}}}}}};
    EXPECT_EQ(tool_call_problem(as_body, weather_tools(), ""), "") << choice.dump();
  }
}

// "required" with parallel_tool_calls left on: every call the model makes is valid for its tool. tiny-glm tends to
// keep calling until max_tokens (a weak model; nothing in a grammar can make it stop), so a response cut off by
// the length limit may end inside its last call: the calls before it must still be valid.
TEST(ConstrainedTools, RequiredParallelCallsAreEachValid) {
  size_t most_calls = 0;
  for (const char* parser : {"glm47", "deepseek_v3"}) {
    TinyServer server(0, false, parser);
    for (int seed : {0, 1, 2, 3}) {
      json req = forced("required", seed == 0 ? 0.0 : 1.0, seed);
      req["max_tokens"] = 400;
      auto [status, body] = server.chat(req);
      ASSERT_EQ(status, 200) << body.dump();
      json& choice = body["choices"][0];
      json& calls = choice["message"]["tool_calls"];
      ASSERT_TRUE(calls.is_array() && !calls.empty()) << parser << " seed " << seed << ": " << body.dump();
      if (choice["finish_reason"] == "length") {
        calls.erase(calls.size() - 1);
        choice["finish_reason"] = "tool_calls";
        if (calls.empty()) continue;
      }
      most_calls = std::max(most_calls, calls.size());
      EXPECT_EQ(tool_calls_problem(body, weather_tools(), "", SIZE_MAX), "") << parser << " seed " << seed;
    }
  }
  EXPECT_GE(most_calls, 2u) << "no response made several calls";
}

TEST(ConstrainedTools, ParallelToolCallsFalseGivesExactlyOneCall) {
  for (const char* parser : {"glm47", "deepseek_v3"}) {
    TinyServer server(0, false, parser);
    for (int seed : {0, 1, 2, 3}) {
      json req = forced("required", seed == 0 ? 0.0 : 1.0, seed);
      req["parallel_tool_calls"] = false;
      auto [status, body] = server.chat(req);
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(tool_call_problem(body, weather_tools(), ""), "") << parser << " seed " << seed;
    }
  }
}

// Thinking on (the default) with a budget: tiny-glm reasons, "</think>" is forced at the budget at the latest, and
// the answer after it is held to the schema. Reasoning goes to reasoning_content, the JSON to content.
TEST(ConstrainedTools, ReasoningBeforeJsonGoesToReasoningContent) {
  TinyServer server;
  const json schema = test_schemas()[0];
  int reasoned = 0;
  for (int seed : {0, 1, 2}) {
    json req = schema_request(schema, "Describe a widget.", seed == 0 ? 0.0 : 1.0, seed);
    req.erase("chat_template_kwargs");
    req["thinking_token_budget"] = 12;
    auto [status, body] = server.chat(req);
    ASSERT_EQ(status, 200) << body.dump();
    EXPECT_EQ(content_problem(body, schema), "") << "seed " << seed;
    const json& message = body["choices"][0]["message"];
    if (message.contains("reasoning_content")) {
      ++reasoned;
      EXPECT_EQ(message["reasoning_content"].get<std::string>().find("</think>"), std::string::npos);
    }
    // At most the budget, the forced "</think>" and the answer.
    EXPECT_LE(body["usage"]["completion_tokens"].get<int>(), 400);
  }
  EXPECT_GT(reasoned, 0) << "the model never reasoned before its answer";

  // enable_thinking=false keeps the grammar from the first token: no reasoning at all.
  auto [status, body] = server.chat(schema_request(schema, "Describe a widget."));
  ASSERT_EQ(status, 200);
  EXPECT_FALSE(body["choices"][0]["message"].contains("reasoning_content")) << body.dump();
  EXPECT_EQ(content_problem(body, schema), "");
}

TEST(ConstrainedTools, ReasoningBeforeAForcedCallInBothFormats) {
  for (const char* parser : {"glm47", "deepseek_v3"}) {
    TinyServer server(0, false, parser);
    for (const json& choice : {json("required"), kNamedAlarm}) {
      json req = forced(choice, 1.0, 5, /*thinking=*/true);
      req["thinking_token_budget"] = 8;
      auto [status, body] = server.chat(req);
      ASSERT_EQ(status, 200) << body.dump();
      const bool named = choice.is_object();
      EXPECT_EQ(tool_calls_problem(body, weather_tools(), named ? "set_alarm" : "", named ? 1 : SIZE_MAX), "")
          << parser << " " << choice.dump();
    }
  }
}

TEST(ConstrainedTools, ThinkingTokenBudgetNeedsAConstrainedAnswer) {
  TinyServer server;
  json req = {{"messages", user("hi")}, {"max_tokens", 4}, {"thinking_token_budget", 8}};
  auto [status, body] = server.chat(req);
  EXPECT_EQ(status, 400) << body.dump();
  EXPECT_EQ(body["error"]["param"], "thinking_token_budget") << body.dump();
  req["thinking_token_budget"] = -1;
  req["response_format"] = {{"type", "json_object"}};
  std::tie(status, body) = server.chat(req);
  EXPECT_EQ(status, 400) << body.dump();
  EXPECT_EQ(body["error"]["param"], "thinking_token_budget") << body.dump();
}

}  // namespace
}  // namespace kiln::testing
