// Clients that are slow, silent, too many, or gone: they hold the server's threads for a bounded time, excess
// connections get 503 with Retry-After at once, and work for a client that left stops. Shutdown waits for
// requests in flight for at most the drain timeout.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "server_test_support.h"

namespace kiln::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A raw TCP connection to the server, for clients httplib::Client cannot imitate.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }
  void send(const std::string& text) const { (void)::send(fd_, text.data(), text.size(), MSG_NOSIGNAL); }

  // What the server sent until it closed the connection or `timeout` passed; `closed` says which.
  std::string receive(std::chrono::milliseconds timeout, bool* closed = nullptr) const {
    std::string out;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        if (closed) *closed = true;
        return out;
      }
      out.append(buffer, static_cast<size_t>(n));
    }
    if (closed) *closed = false;
    return out;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

class SlowClients : public ServerTest {
 protected:
  bool healthy() const {
    auto c = client();
    c->set_connection_timeout(2, 0);
    c->set_read_timeout(2, 0);
    auto res = c->Get("/health");
    return res && res->status == 200;
  }
};

TEST_F(SlowClients, ConnectionsBeyondTheLimitGet503WithRetryAfter) {
  HttpServerOptions options;
  options.max_connections = 4;
  start_server(options);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server_->port()));
    idle.back()->send("GET /health HTTP/1.1\r\nHost: x\r\n");  // never finishes its headers
  }
  std::this_thread::sleep_for(200ms);
  const auto start = Clock::now();
  RawConnection extra(server_->port());
  ASSERT_TRUE(extra.connected());
  extra.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  bool closed = false;
  const std::string response = extra.receive(3s, &closed);
  EXPECT_LT(Clock::now() - start, 1s) << "answered at once, not queued behind the stalled connections";
  EXPECT_EQ(response.rfind("HTTP/1.1 503", 0), 0u) << response;
  EXPECT_NE(response.find("Retry-After: "), std::string::npos) << response;
  EXPECT_NE(response.find("\"too_many_connections\""), std::string::npos) << response;
  EXPECT_TRUE(closed);
}

TEST_F(SlowClients, StalledHeadersAreCutAfterTheHeaderTimeout) {
  HttpServerOptions options;
  options.max_connections = 8;
  options.header_timeout = 500ms;
  start_server(options);
  std::vector<std::unique_ptr<RawConnection>> stalled;
  for (int i = 0; i < 8; ++i) {
    stalled.push_back(std::make_unique<RawConnection>(server_->port()));
    stalled.back()->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  }
  // One byte every 100 ms keeps each of them "active" forever under a per-read timeout; the head deadline
  // still ends them.
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop) {
      for (auto& c : stalled) c->send("X");
      std::this_thread::sleep_for(100ms);
    }
  });
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(healthy()) << "the stalled connections were closed and /health is served again";
  stop = true;
  trickle.join();
  bool closed = false;
  stalled[0]->receive(1s, &closed);
  EXPECT_TRUE(closed);
}

TEST_F(SlowClients, HugeHeadersAreRefused) {
  RawConnection c(server_->port());
  c.send("GET /health HTTP/1.1\r\nX-Big: " + std::string(100 * 1024, 'a') + "\r\n\r\n");
  bool closed = false;
  const std::string response = c.receive(3s, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(response.find("HTTP/1.1 200"), std::string::npos) << response.substr(0, 200);
  EXPECT_TRUE(healthy());
}

TEST_F(SlowClients, StalledBodyIsCutAfterTheReadTimeout) {
  HttpServerOptions options;
  options.read_timeout = 500ms;
  start_server(options);
  RawConnection c(server_->port());
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{");
  const auto start = Clock::now();
  bool closed = false;
  c.receive(5s, &closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_TRUE(engine_.submitted().empty());
}

TEST_F(SlowClients, StopDoesNotWaitOutIdleKeepAliveConnections) {
  RawConnection idle(server_->port());
  idle.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_NE(idle.receive(500ms).find("HTTP/1.1 200"), std::string::npos);  // and the connection stays open
  const auto start = Clock::now();
  server_->stop();
  EXPECT_LT(Clock::now() - start, 1s) << "stop() waited for the keep-alive timeout";
}

TEST_F(SlowClients, NonStreamingRequestStopsWhenTheClientLeaves) {
  HttpServerOptions options;
  options.max_model_len = 100000;
  start_server(options);
  engine_.script(std::vector<int32_t>(50000, server_test_tokenizer().encode("a")[0]));
  {
    auto c = client();
    c->set_read_timeout(0, 300'000);  // an SDK timeout: the client gives up and closes the connection
    auto res = c->Post("/v1/completions", json({{"prompt", "x"}, {"max_tokens", 50000}}).dump(), "application/json");
    EXPECT_FALSE(res);
  }
  EXPECT_TRUE(engine_.wait_idle(2s)) << "the engine still generates for a client that left";
  EXPECT_EQ(engine_.cancelled().size(), 1u);
}

TEST_F(SlowClients, DrainTimeoutCancelsWhatIsStillRunning) {
  HttpServerOptions options;
  options.max_model_len = 100000;
  options.drain_timeout = 300ms;
  start_server(options);
  const int32_t a = server_test_tokenizer().encode("a")[0];
  engine_.script(std::vector<int32_t>(50000, a));
  engine_.script(std::vector<int32_t>(50000, a));
  std::atomic<bool> streaming{false};
  std::string streamed;
  std::thread stream_reader([&] {
    post_streaming("/v1/completions", {{"prompt", "x"}, {"stream", true}, {"max_tokens", 50000}},
                   [&](const std::string& data) {
                     streamed += data;
                     streaming = true;
                     return true;
                   });
  });
  int plain_status = 0;
  std::string plain_body;
  std::thread plain_reader([&] {
    auto res = post("/v1/completions", {{"prompt", "y"}, {"max_tokens", 50000}});
    if (res) {
      plain_status = res->status;
      plain_body = res->body;
    }
  });
  for (int i = 0; i < 500 && (!streaming || engine_.submitted().size() < 2); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(streaming);
  const auto start = Clock::now();
  server_->stop();
  EXPECT_LT(Clock::now() - start, 3s) << "stop() waits for the drain timeout, not for 50000 tokens";
  stream_reader.join();
  plain_reader.join();
  EXPECT_NE(streamed.find("shutting down"), std::string::npos) << streamed.substr(streamed.size() - 300);
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(plain_status, 503) << plain_body;
  EXPECT_TRUE(engine_.wait_idle(1s));
}

}  // namespace
}  // namespace kiln::testing
