// Every refusal path: OpenAI-shaped bodies with the right status, type, param and a message naming the problem.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server_test_support.h"

namespace kiln::testing {
namespace {

using nlohmann::json;

json messages() {
  return json::array({{{"role", "user"}, {"content", "hi"}}});
}

json expect_error(const httplib::Result& res, int status, const std::string& param) {
  EXPECT_TRUE(res);
  if (!res) return {};
  EXPECT_EQ(res->status, status) << res->body;
  json body = json::parse(res->body);
  EXPECT_TRUE(body["error"]["message"].is_string());
  EXPECT_TRUE(body["error"]["type"].is_string());
  EXPECT_TRUE(body["error"].contains("code"));
  if (param.empty()) {
    EXPECT_TRUE(body["error"]["param"].is_null()) << res->body;
  } else {
    EXPECT_EQ(body["error"]["param"], param) << res->body;
  }
  return body["error"];
}

TEST_F(ServerTest, MalformedJsonNamesThePosition) {
  auto res = client()->Post("/v1/chat/completions", R"({"messages": [}, )", "application/json");
  json error = expect_error(res, 400, "body");
  EXPECT_NE(error["message"].get<std::string>().find("column 15"), std::string::npos) << error;
  EXPECT_TRUE(engine_.submitted().empty());
}

TEST_F(ServerTest, WrongTypesNameTheField) {
  json error = expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"temperature", "hot"}}), 400,
                            "temperature");
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_NE(error["message"].get<std::string>().find("number"), std::string::npos);
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"max_tokens", 1.5}}), 400, "max_tokens");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"top_p", 3}}), 400, "top_p");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"stream", "yes"}}), 400, "stream");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"stop", json::array({1})}}), 400, "stop");
  expect_error(post("/v1/chat/completions", {{"messages", "hi"}}), 400, "messages");
  expect_error(post("/v1/chat/completions", {{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}), 400,
               "messages");
  expect_error(post("/v1/completions", {{"prompt", 42}}), 400, "prompt");
  EXPECT_TRUE(engine_.submitted().empty());
}

// The fake engine applies no token masks, as a device recipe's does not yet: JSON formats are refused naming the field
// (no request reaches the engine), while a forced tool call keeps its unconstrained prefill.
TEST_F(ServerTest, ConstrainedDecodingIsRefusedWhereTheEngineAppliesNoMasks) {
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  json error =
      expect_error(post("/v1/chat/completions",
                        {{"messages", messages()},
                         {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", schema}}}}}}),
                   400, "response_format");
  EXPECT_NE(error["message"].get<std::string>().find("CPU recipes only"), std::string::npos) << error;
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"response_format", {{"type", "json_object"}}}}),
               400, "response_format");
  expect_error(post("/v1/responses", {{"input", "hi"}, {"text", {{"format", {{"type", "json_object"}}}}}}), 400,
               "text.format");
  EXPECT_TRUE(engine_.submitted().empty());
  // A text format is no constraint at all.
  auto res = post("/v1/chat/completions", {{"messages", messages()}, {"response_format", {{"type", "text"}}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  const json tools =
      json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  res = post("/v1/chat/completions", {{"messages", messages()},
                                      {"tools", tools},
                                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  ASSERT_EQ(engine_.submitted().size(), 2u);
  EXPECT_EQ(engine_.submitted()[0].constraint, nullptr);
  EXPECT_EQ(engine_.submitted()[1].constraint, nullptr);
}

TEST_F(ServerTest, UnknownModelIs404) {
  json error = expect_error(post("/v1/chat/completions", {{"model", "gpt-9"}, {"messages", messages()}}), 404, "model");
  EXPECT_EQ(error["code"], "model_not_found");
  EXPECT_NE(error["message"].get<std::string>().find("gpt-9"), std::string::npos);
  // The checkpoint id is accepted as well as the served name.
  engine_.script(reply_tokens("</think>ok"));
  auto res = post("/v1/chat/completions", {{"model", "/models/tiny-glm"}, {"messages", messages()}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(ServerTest, EmptyOrMissingMessagesIs400) {
  expect_error(post("/v1/chat/completions", {{"messages", json::array()}}), 400, "messages");
  expect_error(post("/v1/chat/completions", json::object()), 400, "messages");
}

TEST_F(ServerTest, OversizedPromptNamesBothNumbers) {
  json error =
      expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"max_tokens", 10000}}), 400, "max_tokens");
  const std::string message = error["message"];
  EXPECT_NE(message.find("512"), std::string::npos) << message;    // max_model_len
  EXPECT_NE(message.find("10000"), std::string::npos) << message;  // the completion asked for
  EXPECT_EQ(error["code"], "context_length_exceeded");
  std::string long_text;
  for (int i = 0; i < 600; ++i) long_text += "word ";
  expect_error(post("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", long_text}}})}}),
               400, "messages");
  EXPECT_TRUE(engine_.submitted().empty());
}

// n is 1 .. 16 choices (server/choice_set.h); out of range or not an integer is a 400 naming it.
TEST_F(ServerTest, NOutOfRangeIsRefused) {
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"n", 0}}), 400, "n");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"n", 17}}), 400, "n");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"n", "two"}}), 400, "n");
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"n", -1}}), 400, "n");
}

TEST_F(ServerTest, BadToolsAndToolChoice) {
  json tools = json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"tools", "f"}}), 400, "tools");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"tools", tools}, {"tool_choice", "maybe"}}),
               400, "tool_choice");
  expect_error(post("/v1/chat/completions", {{"messages", messages()},
                                             {"tools", tools},
                                             {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}}),
               400, "tool_choice");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"tool_choice", "required"}}), 400,
               "tool_choice");
}

TEST_F(ServerTest, EngineRefusalsMapToHttpStatuses) {
  engine_.refuse_next(invalid_argument("prompt + max_tokens exceeds the KV pool"));
  expect_error(post("/v1/chat/completions", {{"messages", messages()}}), 400, "");
  engine_.refuse_next(resource_exhausted("waiting queue is full"));
  json error = expect_error(post("/v1/chat/completions", {{"messages", messages()}}), 429, "");
  EXPECT_EQ(error["message"], "waiting queue is full");
  engine_.refuse_next(unavailable("engine stopped"));
  expect_error(post("/v1/completions", {{"prompt", "x"}}), 503, "");
  engine_.refuse_next(not_found("no such adapter"));
  expect_error(post("/v1/responses", {{"input", "x"}}), 404, "");
}

// A generation the engine ends with an error: 503 naming the cause when a device or peer is gone (a tensor-parallel
// group broken by a hung or dead rank: no fault of the request), 500 with a request id for a fault of kiln — in one
// body, in a stream's error event, and with n > 1.
TEST_F(ServerTest, FailedGenerationsAre503WhenThePeerIsGoneAnd500Otherwise) {
  const std::string gone = "the tensor-parallel group is broken (restart kiln): collective `socket`: rank 1 did not "
                           "arrive within transport.timeout_s = 3 s";
  auto has = [](const json& e, const std::string& part) {
    return e["message"].get<std::string>().find(part) != std::string::npos;
  };
  engine_.script({5, 6});  // tokens already out before the step failed do not change the answer
  engine_.fail_next(unavailable(gone));
  json error = expect_error(post("/v1/chat/completions", {{"messages", messages()}}), 503, "");
  EXPECT_EQ(error["type"], "service_unavailable");
  EXPECT_TRUE(has(error, gone)) << error;
  EXPECT_FALSE(has(error, "request id")) << error;

  engine_.fail_next(internal_error("the model runner selected 0 tokens (0 accepted) for step 0"));
  error = expect_error(post("/v1/completions", {{"prompt", "x"}}), 500, "");
  EXPECT_EQ(error["type"], "server_error");
  EXPECT_TRUE(has(error, "selected 0 tokens")) << error;
  EXPECT_TRUE(has(error, "request id")) << error;

  // n = 2: the first choice's failure is the response's.
  engine_.fail_next(unavailable(gone));
  error = expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"n", 2}}), 503, "");
  EXPECT_TRUE(has(error, gone)) << error;
  engine_.fail_next(internal_error("a bug"));
  expect_error(post("/v1/chat/completions", {{"messages", messages()}, {"n", 2}}), 500, "");

  // Streamed (200 sent already): the error event carries the kind.
  for (const bool peer_gone : {true, false}) {
    engine_.fail_next(peer_gone ? unavailable(gone) : internal_error("a bug"));
    std::string body;
    auto res = post_streaming("/v1/chat/completions", {{"messages", messages()}, {"stream", true}},
                              [&](const std::string& piece) {
                                body += piece;
                                return true;
                              });
    ASSERT_TRUE(res);
    json last;
    for (const SseEvent& e : parse_sse(body))
      if (e.data != "[DONE]") last = json::parse(e.data);
    ASSERT_TRUE(last.contains("error")) << body;
    EXPECT_EQ(last["error"]["type"], peer_gone ? "service_unavailable" : "server_error") << body;
    EXPECT_TRUE(has(last["error"], peer_gone ? gone : "a bug")) << body;
  }
}

TEST_F(ServerTest, UnknownRouteIsOpenAiShaped404) {
  auto res = client()->Get("/v1/nothing");
  json error = expect_error(res, 404, "");
  EXPECT_NE(error["message"].get<std::string>().find("/v1/nothing"), std::string::npos);
}

TEST_F(ServerTest, ApiKeyGuardsV1ButNotHealth) {
  HttpServerOptions options;
  options.api_key = "sekrit";
  start_server(options);
  json error = expect_error(post("/v1/chat/completions", {{"messages", messages()}}), 401, "");
  EXPECT_EQ(error["code"], "invalid_api_key");
  expect_error(post("/v1/chat/completions", {{"messages", messages()}}, {{"Authorization", "Bearer wrong!"}}), 401, "");
  expect_error(client()->Get("/v1/models"), 401, "");
  auto ok = post("/v1/chat/completions", {{"messages", messages()}}, {{"Authorization", "Bearer sekrit"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto health = client()->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerTest, OverloadIs429NotAQueue) {
  HttpServerOptions options;
  options.max_concurrent_requests = 1;
  options.max_model_len = 100000;
  start_server(options);
  std::vector<int32_t> endless(50000, server_test_tokenizer().encode("a")[0]);
  engine_.script(endless);
  std::atomic<bool> streaming{false}, release{false};
  std::thread holder([&] {
    post_streaming("/v1/completions", {{"prompt", "x"}, {"stream", true}, {"max_tokens", 50000}},
                   [&](const std::string&) {
                     streaming = true;
                     return !release.load();
                   });
  });
  for (int i = 0; i < 500 && !streaming; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(streaming);
  json error = expect_error(post("/v1/completions", {{"prompt", "y"}}), 429, "");
  EXPECT_NE(error["message"].get<std::string>().find("capacity"), std::string::npos);
  release = true;
  holder.join();
  EXPECT_TRUE(engine_.wait_idle(std::chrono::seconds(5)));
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// A request that must be a 400 whose error names `param`.
struct ParamCase {
  std::string path;
  json body;
  std::string param;
};

template <typename Post>
void expect_400s_naming_the_field(const Post& post, const std::vector<ParamCase>& cases) {
  for (const ParamCase& c : cases) {
    auto res = post(c.path, c.body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << c.path << " " << c.body.dump() << ": " << res->body;
    EXPECT_EQ(json::parse(res->body)["error"]["param"], c.param) << c.body.dump() << ": " << res->body;
  }
}

// The fake engine computes no logprobs (an engine that cannot): asking is a 400 naming the field, and
// out-of-range values are 400s before that.
TEST_F(ServerTest, LogprobsRangesAndAvailabilityAre400NamingTheField) {
  const json chat = json::array({{{"role", "user"}, {"content", "hi"}}});
  const std::vector<ParamCase> cases = {
      {"/v1/chat/completions", {{"messages", chat}, {"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {"/v1/chat/completions", {{"messages", chat}, {"logprobs", true}, {"top_logprobs", -1}}, "top_logprobs"},
      {"/v1/chat/completions", {{"messages", chat}, {"top_logprobs", 2}}, "top_logprobs"},
      {"/v1/chat/completions", {{"messages", chat}, {"logprobs", "yes"}}, "logprobs"},
      {"/v1/chat/completions", {{"messages", chat}, {"logprobs", true}}, "logprobs"},
      {"/v1/completions", {{"prompt", "hi"}, {"logprobs", 6}}, "logprobs"},
      {"/v1/completions", {{"prompt", "hi"}, {"logprobs", true}}, "logprobs"},
      {"/v1/completions", {{"prompt", "hi"}, {"logprobs", 1}}, "logprobs"},
      {"/v1/responses", {{"input", "hi"}, {"top_logprobs", 2}}, "top_logprobs"},
  };
  expect_400s_naming_the_field([this](const std::string& p, const json& b) { return post(p, b); }, cases);
  // Off is fine: logprobs false, or null.
  auto res = post("/v1/chat/completions", {{"messages", chat}, {"logprobs", false}, {"max_tokens", 2}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_TRUE(json::parse(res->body)["choices"][0]["logprobs"].is_null());
}


// Penalties, logit_bias and min_p: out-of-range values are 400s naming the field; on an engine that does not apply
// them (the fake one) a real value is a 400 too, and the defaults pass.
TEST_F(ServerTest, PenaltyRangesAndAvailabilityAre400NamingTheField) {
  const json chat = json::array({{{"role", "user"}, {"content", "hi"}}});
  const std::vector<ParamCase> cases = {
      {"/v1/chat/completions", {{"messages", chat}, {"presence_penalty", 2.5}}, "presence_penalty"},
      {"/v1/chat/completions", {{"messages", chat}, {"frequency_penalty", -3}}, "frequency_penalty"},
      {"/v1/chat/completions", {{"messages", chat}, {"repetition_penalty", 0}}, "repetition_penalty"},
      {"/v1/chat/completions", {{"messages", chat}, {"min_p", 1.5}}, "min_p"},
      {"/v1/chat/completions", {{"messages", chat}, {"logit_bias", json::array()}}, "logit_bias"},
      {"/v1/chat/completions", {{"messages", chat}, {"logit_bias", {{"abc", 1}}}}, "logit_bias"},
      {"/v1/chat/completions", {{"messages", chat}, {"logit_bias", {{"-3", 1}}}}, "logit_bias"},
      {"/v1/chat/completions", {{"messages", chat}, {"logit_bias", {{"99999999999", 1}}}}, "logit_bias"},
      {"/v1/chat/completions", {{"messages", chat}, {"logit_bias", {{"5", 101}}}}, "logit_bias"},
      {"/v1/chat/completions", {{"messages", chat}, {"logit_bias", {{"5", "x"}}}}, "logit_bias"},
      {"/v1/completions", {{"prompt", "hi"}, {"presence_penalty", "high"}}, "presence_penalty"},
      // In range, but this engine does not apply them.
      {"/v1/chat/completions", {{"messages", chat}, {"presence_penalty", 0.5}}, "presence_penalty"},
      {"/v1/chat/completions", {{"messages", chat}, {"frequency_penalty", 1}}, "frequency_penalty"},
      {"/v1/chat/completions", {{"messages", chat}, {"repetition_penalty", 1.2}}, "repetition_penalty"},
      {"/v1/chat/completions", {{"messages", chat}, {"logit_bias", {{"5", 10}}}}, "logit_bias"},
      {"/v1/completions", {{"prompt", "hi"}, {"min_p", 0.1}}, "min_p"},
  };
  expect_400s_naming_the_field([this](const std::string& p, const json& b) { return post(p, b); }, cases);
  // The defaults, as clients send them, change nothing and pass.
  auto res = post("/v1/chat/completions", {{"messages", chat}, {"presence_penalty", 0}, {"frequency_penalty", 0},
                                           {"repetition_penalty", 1}, {"min_p", 0}, {"logit_bias", json::object()},
                                           {"max_tokens", 2}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
}

}  // namespace
}  // namespace kiln::testing
