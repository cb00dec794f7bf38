// A prompt that takes longer to prefill than the keep-alive interval: streams get ": keep-alive" comments while
// they wait (and, when asked, prefill_progress events), non-streaming requests still get their answer, and every
// connection has TCP keep-alive probes.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "server/guarded_http_server.h"
#include "server_test_support.h"

namespace kiln::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class PrefillKeepAlive : public ServerTest {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.keep_alive_interval = 20ms;
    start_server(options);
    engine_.set_prefill_time(400ms, 4);
    engine_.set_default_reply(reply_tokens("Hello there."));
  }

  // The raw SSE body of a streamed request.
  std::string stream(const std::string& path, json body) {
    body["stream"] = true;
    std::string raw;
    auto res = post_streaming(path, body, [&](const std::string& data) {
      raw += data;
      return true;
    });
    EXPECT_TRUE(res);
    return raw;
  }
};

// Whether an SSE data payload carries generated text (chat delta or completion text).
bool has_text(const std::string& data) {
  const json j = json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) return false;
  const json& c = j["choices"][0];
  for (const json* v : {c.contains("text") ? &c["text"] : nullptr,
                        c.contains("delta") && c["delta"].contains("content") ? &c["delta"]["content"] : nullptr,
                        c.contains("delta") && c["delta"].contains("reasoning_content") ? &c["delta"]["reasoning_content"]
                                                                                       : nullptr})
    if (v && v->is_string() && !v->get<std::string>().empty()) return true;
  return false;
}

// Where the first block of a stream that carries text starts (npos when none).
size_t first_text(const std::string& raw) {
  for (size_t at = 0; at < raw.size();) {
    size_t end = raw.find("\n\n", at);
    if (end == std::string::npos) end = raw.size();
    const std::string block = raw.substr(at, end - at);
    const size_t data = block.find("data: ");
    if (data != std::string::npos && has_text(block.substr(data + 6))) return at;
    at = end + 2;
  }
  return std::string::npos;
}

TEST_F(PrefillKeepAlive, StreamsGetCommentHeartbeatsWhilePrefilling) {
  for (const std::string path : {"/v1/chat/completions", "/v1/completions"}) {
    json body = {{"max_tokens", 20}};
    if (path == "/v1/chat/completions")
      body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
    else
      body["prompt"] = "hi";
    const std::string raw = stream(path, body);
    const size_t text = first_text(raw);
    ASSERT_NE(text, std::string::npos) << raw;
    const std::string before = raw.substr(0, text);
    size_t beats = 0;
    for (size_t at = before.find(": keep-alive\n\n"); at != std::string::npos;
         at = before.find(": keep-alive\n\n", at + 1))
      ++beats;
    // 400 ms of prefill at a 20 ms interval (checked every 50 ms): several comments before the first token.
    EXPECT_GE(beats, 3u) << path << ":\n" << raw;
    EXPECT_EQ(raw.find("prefill_progress"), std::string::npos) << "progress events nobody asked for";
    EXPECT_NE(raw.find("data: [DONE]"), std::string::npos);
  }
}

TEST_F(PrefillKeepAlive, ProgressEventsWhenAsked) {
  const std::string raw =
      stream("/v1/chat/completions", {{"max_tokens", 20},
                                      {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                                      {"stream_options", {{"include_prefill_progress", true}}}});
  std::vector<int64_t> done;
  int64_t total = -1;
  bool seen_content = false;
  for (const SseEvent& e : parse_sse(raw)) {
    if (e.event != "prefill_progress") {
      if (has_text(e.data)) seen_content = true;
      continue;
    }
    EXPECT_FALSE(seen_content) << "progress after the first token";
    const json j = json::parse(e.data);
    EXPECT_EQ(j["object"], "prefill.progress");
    EXPECT_EQ(j["choices"], json::array());
    done.push_back(j["prompt_tokens_done"].get<int64_t>());
    total = j["prompt_tokens_total"].get<int64_t>();
  }
  ASSERT_EQ(done.size(), 3u) << raw;  // 4 chunks: told after each but the last
  EXPECT_GT(total, 0);
  for (size_t i = 1; i < done.size(); ++i) EXPECT_GT(done[i], done[i - 1]);
  EXPECT_LT(done.back(), total);
  EXPECT_TRUE(seen_content);
  ASSERT_FALSE(engine_.submitted().empty());
  EXPECT_TRUE(engine_.submitted().back().report_prefill_progress);
}

TEST_F(PrefillKeepAlive, ProgressNeedsABooleanAndIsOffForNonStreamingRequests) {
  auto bad = post("/v1/completions",
                  {{"prompt", "hi"}, {"stream", true}, {"stream_options", {{"include_prefill_progress", "yes"}}}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "stream_options.include_prefill_progress") << bad->body;

  auto res = post("/v1/completions",
                  {{"prompt", "hi"}, {"max_tokens", 20}, {"stream_options", {{"include_prefill_progress", true}}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_NE(res->body.find("Hello there."), std::string::npos) << res->body;  // the whole text, in one body
  EXPECT_FALSE(engine_.submitted().back().report_prefill_progress);
}

TEST(TcpKeepAlive, ProbesAreSetAtTheInterval) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(enable_tcp_keepalive(fd, std::chrono::seconds(7)));
  int on = 0, idle = 0, interval = 0;
  socklen_t n = sizeof(int);
  ASSERT_EQ(::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &n), 0);
  ASSERT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &n), 0);
  ASSERT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, &n), 0);
  EXPECT_EQ(on, 1);
  EXPECT_EQ(idle, 7);
  EXPECT_EQ(interval, 7);
  ::close(fd);
}

TEST(TcpKeepAlive, ServerRefusesANonPositiveInterval) {
  FakeEngine engine;
  HttpServerOptions options;
  options.port = 0;
  options.max_model_len = 512;
  options.keep_alive_interval = 0ms;
  HttpServer server(engine, server_test_tokenizer(), options);
  const Status s = server.start();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("server.keep_alive_interval_s"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kiln::testing
