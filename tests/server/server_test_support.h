// A running HttpServer on an ephemeral loopback port, in front of a FakeEngine and the fixture tokenizer
// (tests/data/tokenizer/tokenizer.json, which has GLM's special tokens), plus SSE parsing for the tests.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fake_engine.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace kiln::testing {

inline const Tokenizer& server_test_tokenizer() {
  static const Tokenizer tokenizer = [] {
    auto loaded = Tokenizer::load(std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/tokenizer/tokenizer.json");
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status().to_string();
      std::abort();
    }
    return std::move(loaded).value();
  }();
  return tokenizer;
}

// Token ids for `text` (special tokens such as </think> and <tool_call> included), plus <|user|> to end the turn.
inline std::vector<int32_t> reply_tokens(const std::string& text, bool end_turn = true) {
  std::vector<int32_t> ids = server_test_tokenizer().encode(text, /*parse_special=*/true);
  if (end_turn) ids.push_back(*server_test_tokenizer().token_to_id("<|user|>"));
  return ids;
}

struct SseEvent {
  std::string event;  // "event:" line, empty when absent
  std::string data;
};

inline std::vector<SseEvent> parse_sse(const std::string& body) {
  std::vector<SseEvent> events;
  SseEvent current;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) {
      if (!current.data.empty() || !current.event.empty()) events.push_back(current);
      current = SseEvent();
    } else if (line.rfind("data: ", 0) == 0) {
      current.data += line.substr(6);
    } else if (line.rfind("event: ", 0) == 0) {
      current.event = line.substr(7);
    }
  }
  return events;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { start_server(HttpServerOptions()); }
  void TearDown() override { server_.reset(); }

  void start_server(HttpServerOptions options) {
    server_.reset();
    options.host = "127.0.0.1";
    options.port = 0;
    if (options.model_id.empty()) options.model_id = "/models/tiny-glm";
    if (options.served_name.empty()) options.served_name = "tiny-glm";
    if (options.max_model_len == 0) options.max_model_len = 512;
    server_ = std::make_unique<HttpServer>(engine_, server_test_tokenizer(), options);
    Status started = server_->start();
    ASSERT_TRUE(started.ok()) << started.to_string();
  }

  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    c->set_read_timeout(10, 0);
    return c;
  }

  httplib::Result post(const std::string& path, const nlohmann::json& body, httplib::Headers headers = {}) const {
    return client()->Post(path, headers, body.dump(), "application/json");
  }

  // POSTs and hands each received piece of the body to `on_data`; returning false drops the connection.
  httplib::Result post_streaming(const std::string& path, const nlohmann::json& body,
                                 std::function<bool(const std::string&)> on_data) const {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [on_data](const char* data, size_t n, uint64_t, uint64_t) {
      return on_data(std::string(data, n));
    };
    return client()->send(req);
  }

  FakeEngine engine_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace kiln::testing
