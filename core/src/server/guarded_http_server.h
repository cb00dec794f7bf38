// cpp-httplib's Server (0.11, as Debian ships it) with the limits a server facing untrusted clients needs,
// which that version lacks:
//   - at most `max_connections` connections are served at once. The next one is answered at once from the
//     accept thread with 503 and Retry-After, and closed: a flood of idle sockets cannot queue up in front of
//     /health or of the requests being served;
//   - a request's line and headers must arrive within header_timeout of its first byte (and stay under
//     kMaxHeaderBytes) and its body within read_timeout of the headers; an idle connection is closed after
//     httplib's keep-alive timeout and a write blocked longer than its write timeout fails: slow or silent
//     clients hold a thread for a bounded time (slowloris);
//   - a handler can ask whether its client is still connected, so work for a client that left can stop.
// Each connection is served on a pool thread by this class's keep-alive loop over its own socket stream
// (httplib's are internal to the library); httplib still parses requests and runs the routes.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace kiln {

struct ConnectionLimits {
  int max_connections = 512;
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds read_timeout{60'000};
  int retry_after_seconds = 1;
  // TCP keep-alive probes on every served connection after this long without traffic (0 = off): a non-streaming
  // request that waits out a long prefill sends nothing, and NATs and proxies drop connections that look dead.
  std::chrono::seconds tcp_keepalive_idle{0};
};

// SO_KEEPALIVE with the first probe after `idle` and further probes every `idle` (at least 1 s each).
bool enable_tcp_keepalive(socket_t sock, std::chrono::seconds idle);

// Every connection holds a socket, and httplib (built to select(), not poll()) answers 500 on sockets numbered at
// or above FD_SETSIZE (1024): this leaves room below it for the process's other descriptors.
inline constexpr int kMaxConnections = 900;

// Request line plus headers; more is refused (httplib would buffer a header line of any length).
inline constexpr std::size_t kMaxHeaderBytes = 64 * 1024;

class GuardedHttpServer : public httplib::Server {
 public:
  // `reject_body` is the JSON body of the 503 sent beyond max_connections; `on_reject` runs for each one.
  GuardedHttpServer(ConnectionLimits limits, std::string reject_body, std::function<void()> on_reject);

  // Whether the client of the request this thread is handling is still connected (true off connection threads).
  // A client that half-closes its side after sending the request counts as gone.
  static bool client_connected();

 private:
  bool process_and_close_socket(socket_t sock) override;
  // Waits for the first byte of the connection's next request: false after the keep-alive timeout or on stop().
  bool wait_for_request(socket_t sock) const;
  void reject(socket_t sock) const;

  ConnectionLimits limits_;
  std::string reject_response_;
  std::function<void()> on_reject_;
};

}  // namespace kiln
