// /v1/completions, /v1/responses, /v1/models, /health, /metrics, and the request lifecycle: a client that
// disconnects mid-stream is cancelled in the engine; stop() drains in-flight streams before closing.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "server_test_support.h"

namespace kiln::testing {
namespace {

using nlohmann::json;

TEST_F(ServerTest, CompletionsNonStreamAndStream) {
  engine_.script(reply_tokens(" jumps over the lazy dog"));
  auto res = post("/v1/completions", {{"prompt", "The quick brown fox"}, {"max_tokens", 30}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], " jumps over the lazy dog");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(server_test_tokenizer().decode(engine_.submitted()[0].prompt), "The quick brown fox");

  engine_.script(reply_tokens(" jumps over"));
  res = post("/v1/completions", {{"prompt", "fox"}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(res);
  auto events = parse_sse(res->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back().data, "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i].data);
    if (!c["choices"].empty()) text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, " jumps over");
  EXPECT_GT(json::parse(events[events.size() - 2].data)["usage"]["completion_tokens"].get<int>(), 0);
  // OpenAI's default completion length.
  EXPECT_EQ(engine_.submitted()[1].max_tokens, 16);
}

TEST_F(ServerTest, ResponsesNonStreamWithReasoningTextAndFunctionCall) {
  engine_.script(reply_tokens(
      "Need a tool.</think>Looking it up.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Lima</arg_value>"
      "</tool_call>"));
  json tools = json::parse(R"([{"type": "function", "name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}}}])");
  auto res = post("/v1/responses", {{"input", "weather in Lima?"}, {"instructions", "Be brief."}, {"tools", tools}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "response");
  EXPECT_EQ(body["status"], "completed");
  ASSERT_EQ(body["output"].size(), 3u) << body.dump(2);
  EXPECT_EQ(body["output"][0]["type"], "reasoning");
  EXPECT_EQ(body["output"][0]["content"][0]["text"], "Need a tool.");
  EXPECT_EQ(body["output"][1]["type"], "message");
  EXPECT_EQ(body["output"][1]["content"][0]["type"], "output_text");
  EXPECT_EQ(body["output"][1]["content"][0]["text"], "Looking it up.");
  EXPECT_EQ(body["output"][2]["type"], "function_call");
  EXPECT_EQ(body["output"][2]["name"], "get_weather");
  EXPECT_EQ(body["output"][2]["arguments"], R"({"city": "Lima"})");
  EXPECT_EQ(body["output"][2]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_GT(body["usage"]["input_tokens"].get<int>(), 0);
  std::string prompt = server_test_tokenizer().decode(engine_.submitted()[0].prompt);
  EXPECT_NE(prompt.find("<|system|>"), std::string::npos);
  EXPECT_NE(prompt.find("Be brief."), std::string::npos);
  EXPECT_NE(prompt.find("get_weather"), std::string::npos);
}

TEST_F(ServerTest, ResponsesInputItemsCarryToolOutputs) {
  engine_.script(reply_tokens("</think>Cloudy."));
  json input = json::parse(R"([
    {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
    {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": "{\"city\": \"Lima\"}"},
    {"type": "function_call_output", "call_id": "call_9", "output": "cloudy"}])");
  auto res = post("/v1/responses", {{"input", input}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["output"][0]["content"][0]["text"], "Cloudy.");
  std::string prompt = server_test_tokenizer().decode(engine_.submitted()[0].prompt);
  EXPECT_NE(prompt.find("<tool_call>get_weather"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<tool_response>cloudy</tool_response>"), std::string::npos) << prompt;
}

TEST_F(ServerTest, ResponsesStreamEmitsTypedEventsInOrder) {
  engine_.script(
      reply_tokens("Hmm.</think>Answer text.<tool_call>f<arg_key>q</arg_key><arg_value>x y</arg_value></tool_call>"));
  json tools = json::parse(R"([{"type": "function", "name": "f", "parameters": {"type": "object",
    "properties": {"q": {"type": "string"}}}}])");
  auto res = post("/v1/responses", {{"input", "q"}, {"tools", tools}, {"stream", true}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::vector<std::string> types;
  std::string text, arguments;
  int64_t expected_sequence = 0;
  json completed;
  for (const auto& e : parse_sse(res->body)) {
    json data = json::parse(e.data);
    EXPECT_EQ(e.event, data["type"]);
    EXPECT_EQ(data["sequence_number"], expected_sequence++);
    types.push_back(data["type"]);
    if (data["type"] == "response.output_text.delta") text += data["delta"].get<std::string>();
    if (data["type"] == "response.function_call_arguments.delta") arguments += data["delta"].get<std::string>();
    if (data["type"] == "response.function_call_arguments.done") EXPECT_EQ(data["arguments"], arguments);
    if (data["type"] == "response.output_text.done") EXPECT_EQ(data["text"], text);
    if (data["type"] == "response.completed") completed = data["response"];
  }
  ASSERT_GE(types.size(), 6u);
  EXPECT_EQ(types[0], "response.created");
  EXPECT_EQ(types[1], "response.in_progress");
  EXPECT_EQ(types.back(), "response.completed");
  for (const char* t : {"response.output_item.added", "response.reasoning_text.delta", "response.content_part.added",
                        "response.output_text.done", "response.content_part.done", "response.output_item.done"}) {
    EXPECT_NE(std::find(types.begin(), types.end(), t), types.end()) << t;
  }
  EXPECT_EQ(text, "Answer text.");
  EXPECT_EQ(arguments, R"({"q": "x y"})");
  ASSERT_EQ(completed["output"].size(), 3u);
  EXPECT_EQ(completed["output"][2]["arguments"], arguments);
  EXPECT_EQ(completed["status"], "completed");
}

TEST_F(ServerTest, ResponsesRefusesPreviousResponseId) {
  auto res = post("/v1/responses", {{"input", "x"}, {"previous_response_id", "resp_1"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "previous_response_id");
}

TEST_F(ServerTest, ModelsAndHealth) {
  auto res = client()->Get("/v1/models");
  ASSERT_TRUE(res);
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 1u);
  EXPECT_EQ(body["data"][0]["id"], "tiny-glm");
  EXPECT_EQ(body["data"][0]["root"], "/models/tiny-glm");
  EXPECT_EQ(body["data"][0]["max_model_len"], 512);
  auto health = client()->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerTest, MetricsAreValidPrometheusText) {
  const auto reply = reply_tokens("</think>a b c d");
  engine_.script(reply);
  ASSERT_TRUE(post("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}}));
  ASSERT_TRUE(post("/v1/chat/completions", {{"messages", json::array()}}));  // a rejected request
  auto res = client()->Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"]*",?)*\})? (\S+)$)");
  const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  std::map<std::string, double> values;
  std::istringstream lines(res->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("#", 0) == 0) {
      EXPECT_TRUE(std::regex_match(line, comment)) << line;
      continue;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
    double v = std::stod(m[4].str());
    values[line.substr(0, line.rfind(' '))] = v;
  }
  const std::string labels = "{model_name=\"tiny-glm\"}";
  for (const char* name : {"kiln:num_requests_running", "kiln:num_requests_waiting", "kiln:kv_cache_usage_ratio",
                           "kiln:prompt_tokens_total", "kiln:generation_tokens_total", "kiln:prefix_cache_hits_total",
                           "kiln:prefix_cache_queries_total", "kiln:time_to_first_token_seconds_count",
                           "kiln:inter_token_latency_seconds_count"}) {
    EXPECT_TRUE(values.count(name + labels)) << name;
  }
  EXPECT_EQ(values["kiln:time_to_first_token_seconds_count" + labels], 1);
  EXPECT_EQ(values["kiln:inter_token_latency_seconds_count" + labels], reply.size() - 1);  // gaps between tokens
  EXPECT_EQ(values["kiln:time_to_first_token_seconds_bucket{model_name=\"tiny-glm\",le=\"+Inf\"}"], 1);
  EXPECT_EQ(values["kiln:request_success_total{model_name=\"tiny-glm\",finished_reason=\"stop\"}"], 1);
  EXPECT_EQ(values["kiln:request_rejected_total{model_name=\"tiny-glm\",status=\"400\"}"], 1);
  EXPECT_GT(values["kiln:generation_tokens_total" + labels], 0);
}

TEST_F(ServerTest, DisconnectMidStreamCancelsTheEngineRequest) {
  HttpServerOptions options;
  options.max_model_len = 100000;
  start_server(options);
  engine_.script(std::vector<int32_t>(50000, server_test_tokenizer().encode("a")[0]));
  int chunks = 0;
  auto res = post_streaming("/v1/completions", {{"prompt", "x"}, {"stream", true}, {"max_tokens", 50000}},
                            [&](const std::string&) { return ++chunks < 3; });
  EXPECT_FALSE(res) << "the client aborted the transfer";
  EXPECT_TRUE(engine_.wait_idle(std::chrono::seconds(3))) << "the engine still holds the sequence";
  EXPECT_EQ(engine_.cancelled().size(), 1u);
}

TEST_F(ServerTest, StopDrainsInFlightStreamsThenCloses) {
  engine_.script(reply_tokens(std::string(200, 'z'), true));
  std::atomic<bool> streaming{false};
  std::string body;
  std::thread reader([&] {
    post_streaming("/v1/chat/completions",
                   {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}, {"stream", true}},
                   [&](const std::string& data) {
                     body += data;
                     streaming = true;
                     return true;
                   });
  });
  for (int i = 0; i < 500 && !streaming; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(streaming);
  const int port = server_->port();
  server_->stop();
  reader.join();
  EXPECT_EQ(engine_.drain_calls(), 1);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << "the drained stream completes";
  EXPECT_NE(body.find("\"finish_reason\":\"stop\""), std::string::npos);
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(1, 0);
  EXPECT_FALSE(after.Get("/health")) << "the listener is closed";
  server_->stop();  // idempotent
}

}  // namespace
}  // namespace kiln::testing
