// /v1/chat/completions end to end over HTTP against the fake engine: answers, SSE chunks, reasoning split,
// tool calls (whole, streamed, forced), tool-result round trips, and stop strings.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "server_test_support.h"

namespace kiln::testing {
namespace {

using nlohmann::json;

const json kWeatherTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Weather for a city", "parameters": {"type": "object", "properties": {
  "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}])");

json user_says(const std::string& text) {
  return json::array({{{"role", "user"}, {"content", text}}});
}

std::string decode(const std::vector<int32_t>& ids) {
  return server_test_tokenizer().decode(ids);
}

std::vector<json> sse_chunks(const std::string& body, bool* saw_done) {
  std::vector<json> chunks;
  *saw_done = false;
  for (const auto& e : parse_sse(body)) {
    EXPECT_FALSE(*saw_done) << "data after [DONE]";
    if (e.data == "[DONE]") {
      *saw_done = true;
      continue;
    }
    chunks.push_back(json::parse(e.data));  // throws (fails the test) on a malformed chunk
  }
  return chunks;
}

TEST_F(ServerTest, ChatAnswerSplitsReasoningAndReportsUsage) {
  engine_.script(reply_tokens("I should greet.</think>Hello there!"));
  auto res = post("/v1/chat/completions",
                  {{"model", "tiny-glm"}, {"messages", user_says("hi")}, {"temperature", 0.5}, {"max_tokens", 50}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "tiny-glm");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello there!");
  EXPECT_EQ(body["choices"][0]["message"]["reasoning_content"], "I should greet.");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");

  auto submitted = engine_.submitted();
  ASSERT_EQ(submitted.size(), 1u);
  const RequestParams& p = submitted[0];
  EXPECT_EQ(p.max_tokens, 50);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
  std::string prompt = decode(p.prompt);
  EXPECT_EQ(prompt.rfind("[gMASK]<sop>", 0), 0u) << prompt;
  EXPECT_NE(prompt.find("<|user|>hi"), std::string::npos) << prompt;
  EXPECT_EQ(prompt.substr(prompt.size() - 20), "<|assistant|><think>");
  EXPECT_EQ(body["usage"]["prompt_tokens"], static_cast<int64_t>(p.prompt.size()));
  EXPECT_EQ(body["usage"]["completion_tokens"],
            static_cast<int64_t>(reply_tokens("I should greet.</think>Hello there!").size()));
  EXPECT_EQ(body["usage"]["total_tokens"],
            body["usage"]["prompt_tokens"].get<int64_t>() + body["usage"]["completion_tokens"].get<int64_t>());
}

TEST_F(ServerTest, ChatStreamIsWellFormedSseEndingWithUsageAndDone) {
  engine_.script(reply_tokens("Thinking hard.</think>Streamed answer, word by word."));
  auto res = post("/v1/chat/completions",
                  {{"messages", user_says("go")}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_NE(res->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  bool done = false;
  auto chunks = sse_chunks(res->body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 4u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content, reasoning, finish;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    const json& c = chunks[i];
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], chunks[0]["id"]);
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "Thinking hard.");
  EXPECT_EQ(content, "Streamed answer, word by word.");
  EXPECT_EQ(finish, "stop");
  const json& last = chunks.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_GT(last["usage"]["completion_tokens"].get<int>(), 5);
}

TEST_F(ServerTest, ChatStreamWithoutUsageOptionHasNoUsage) {
  engine_.script(reply_tokens("x</think>y"));
  auto res = post("/v1/chat/completions", {{"messages", user_says("go")}, {"stream", true}});
  ASSERT_TRUE(res);
  bool done = false;
  for (const auto& c : sse_chunks(res->body, &done)) EXPECT_FALSE(c.contains("usage"));
  EXPECT_TRUE(done);
}

TEST_F(ServerTest, ToolCallsComeBackAsOpenAiToolCalls) {
  engine_.script(reply_tokens(
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
      "<arg_value>2</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
      "</tool_call>",
      false));
  auto res = post("/v1/chat/completions", {{"messages", user_says("weather?")},
                                           {"tools", kWeatherTools},
                                           {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json choice = json::parse(res->body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 2u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}, {"days", 2}}));
  EXPECT_EQ(json::parse(choice["message"]["tool_calls"][1]["function"]["arguments"].get<std::string>()),
            json({{"city", "Oslo"}}));
  EXPECT_NE(call["id"], choice["message"]["tool_calls"][1]["id"]);

  std::string prompt = decode(engine_.submitted()[0].prompt);
  EXPECT_NE(prompt.find("get_weather"), std::string::npos) << "tools are rendered into the prompt";
  EXPECT_EQ(prompt.substr(prompt.size() - 21), "<|assistant|></think>");
}

TEST_F(ServerTest, ToolCallsStreamNameFirstThenArgumentDeltas) {
  engine_.script(reply_tokens(
      "Let me check.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>San Francisco</arg_value>"
      "<arg_key>days</arg_key><arg_value>5</arg_value></tool_call>"));
  auto res =
      post("/v1/chat/completions", {{"messages", user_says("weather?")}, {"tools", kWeatherTools}, {"stream", true}});
  ASSERT_TRUE(res);
  bool done = false;
  auto chunks = sse_chunks(res->body, &done);
  EXPECT_TRUE(done);
  std::string arguments, name, id, finish;
  int argument_chunks = 0;
  for (const auto& c : chunks) {
    const json& choice = c["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    if (!choice["delta"].contains("tool_calls")) continue;
    const json& tc = choice["delta"]["tool_calls"][0];
    EXPECT_EQ(tc["index"], 0);
    if (tc.contains("id")) {
      EXPECT_TRUE(name.empty()) << "the call starts once";
      id = tc["id"];
      name = tc["function"]["name"];
      EXPECT_EQ(tc["type"], "function");
      EXPECT_EQ(tc["function"]["arguments"], "");
    } else {
      EXPECT_FALSE(name.empty()) << "arguments before the name";
      arguments += tc["function"]["arguments"].get<std::string>();
      ++argument_chunks;
    }
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_GT(argument_chunks, 2) << "arguments stream in several deltas";
  EXPECT_EQ(json::parse(arguments), json({{"city", "San Francisco"}, {"days", 5}}));
  EXPECT_EQ(finish, "tool_calls");
}

TEST_F(ServerTest, ToolResultsAreRenderedForTheNextTurn) {
  engine_.script(reply_tokens("</think>It is sunny in Paris."));
  json messages = json::parse(R"([
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24C"}])");
  auto res = post("/v1/chat/completions", {{"messages", messages}, {"tools", kWeatherTools}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["choices"][0]["message"]["content"], "It is sunny in Paris.");
  std::string prompt = decode(engine_.submitted()[0].prompt);
  EXPECT_NE(prompt.find("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|observation|><tool_response>sunny, 24C</tool_response>"), std::string::npos) << prompt;
}

TEST_F(ServerTest, NamedToolChoiceStartsTheCall) {
  engine_.script(reply_tokens("<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>"));
  auto res =
      post("/v1/chat/completions", {{"messages", user_says("anything")},
                                    {"tools", kWeatherTools},
                                    {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json message = json::parse(res->body)["choices"][0]["message"];
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"city": "Rome"})");
  std::string prompt = decode(engine_.submitted()[0].prompt);
  EXPECT_EQ(prompt.substr(prompt.size() - 30), "</think><tool_call>get_weather") << prompt;
}

TEST_F(ServerTest, ToolChoiceNoneNeitherRendersNorParsesTools) {
  engine_.script(reply_tokens("</think><tool_call>get_weather</tool_call>"));
  auto res =
      post("/v1/chat/completions", {{"messages", user_says("x")}, {"tools", kWeatherTools}, {"tool_choice", "none"}});
  ASSERT_TRUE(res);
  json choice = json::parse(res->body)["choices"][0];
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(decode(engine_.submitted()[0].prompt).find("get_weather"), std::string::npos);
}

TEST_F(ServerTest, StopStringAcrossTokensIsCutAndCancelsTheEngineRequest) {
  const std::string stop = "three four";
  ASSERT_GT(server_test_tokenizer().encode(stop).size(), 1u);
  engine_.script(reply_tokens("</think>one two three four five six seven"));
  for (bool stream : {false, true}) {
    if (stream) engine_.script(reply_tokens("</think>one two three four five six seven"));
    auto res = post("/v1/chat/completions",
                    {{"messages", user_says("count")}, {"stop", json::array({"never", stop})}, {"stream", stream}});
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    std::string content, finish;
    if (stream) {
      bool done = false;
      for (const auto& c : sse_chunks(res->body, &done)) {
        const json& choice = c["choices"][0];
        if (choice["delta"].contains("content")) content += choice["delta"]["content"].get<std::string>();
        if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
      }
    } else {
      json choice = json::parse(res->body)["choices"][0];
      content = choice["message"]["content"];
      finish = choice["finish_reason"];
    }
    EXPECT_EQ(content, "one two ");
    EXPECT_EQ(finish, "stop");
  }
  EXPECT_TRUE(engine_.wait_idle(std::chrono::seconds(2)));
  EXPECT_EQ(engine_.cancelled().size(), 2u) << "the engine must stop generating past the stop string";
}

TEST_F(ServerTest, LengthLimitReportsLength) {
  engine_.script(reply_tokens("</think>a b c d e f g h i j k l m n o p"));
  auto res = post("/v1/chat/completions", {{"messages", user_says("x")}, {"max_completion_tokens", 4}});
  ASSERT_TRUE(res);
  json body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
  EXPECT_EQ(engine_.submitted()[0].max_tokens, 4);
}

TEST_F(ServerTest, SeedAndTopKReachTheEngine) {
  engine_.script(reply_tokens("</think>ok"));
  auto res = post("/v1/chat/completions",
                  {{"messages", user_says("x")}, {"seed", 1234}, {"top_k", 40}, {"top_p", 0.9}, {"temperature", 0}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const SamplingOptions s = engine_.submitted()[0].sampling;  // submitted() returns a copy
  EXPECT_EQ(s.seed, 1234u);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.temperature, 0.0f);
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// A checkpoint with its own template (tests/data/chat_templates/glm5_next): the prompt is what that template renders
// for the request's messages and chat_template_kwargs, and client-written special tokens stay text.
class CheckpointTemplate : public ServerTest {
 protected:
  void SetUp() override {
    auto t = JinjaChatTemplate::from_checkpoint(std::filesystem::path(KILN_SOURCE_DIR) /
                                                "tests/data/chat_templates/glm5_next");
    ASSERT_TRUE(t.ok() && t->has_value()) << t.status().to_string();
    HttpServerOptions options;
    options.chat_template = std::make_shared<const JinjaChatTemplate>(std::move(**t));
    start_server(options);
    engine_.set_default_reply(reply_tokens("Fine."));
  }
};

TEST_F(CheckpointTemplate, PromptIsTheCheckpointTemplateWithTheRequestsKwargs) {
  auto res = post("/v1/chat/completions",
                  {{"messages", json::array({{{"role", "user"}, {"content", "Hi <|user|>"}}})},
                   {"chat_template_kwargs", {{"reasoning_effort", "high"}, {"enable_thinking", false}}}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::vector<int32_t> prompt = engine_.submitted().back().prompt;
  EXPECT_EQ(server_test_tokenizer().decode(prompt), "[gMASK]<sop><|user|>Hi <|user|><|assistant|></think>effort=high");
  const int32_t user = *server_test_tokenizer().token_to_id("<|user|>");
  EXPECT_EQ(std::count(prompt.begin(), prompt.end(), user), 1) << "the client's <|user|> became a token";
}

TEST_F(CheckpointTemplate, TemplateErrorsAndReservedKwargsAre400) {
  auto res = post("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
                                           {"chat_template_kwargs", {{"add_generation_prompt", false}}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "chat_template_kwargs.add_generation_prompt") << res->body;

  // The template gets the messages as sent, and this one raises for a role it does not know ("developer").
  res = post("/v1/chat/completions", {{"messages", json::array({{{"role", "developer"}, {"content", "x"}}})}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json error = json::parse(res->body)["error"];
  EXPECT_EQ(error["param"], "messages") << res->body;
  EXPECT_NE(error["message"].get<std::string>().find("unknown role developer"), std::string::npos) << res->body;
}

}  // namespace
}  // namespace kiln::testing
