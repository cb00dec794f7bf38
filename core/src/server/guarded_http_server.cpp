#include "server/guarded_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

// The connection this thread is serving, for client_connected().
thread_local socket_t t_client_socket = INVALID_SOCKET;
// Set while the accept thread runs a connection's task itself because every pool thread is busy.
thread_local bool t_rejecting = false;

// Waits until `sock` reports one of `events` (or an error / hang-up, which the next call reports) or `deadline`.
bool wait_for(socket_t sock, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{sock, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 0, INT_MAX)));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

void describe(const sockaddr_storage& addr, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(addr);
    ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
    port = ntohs(a.sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(addr);
    ::inet_ntop(AF_INET6, &a.sin6_addr, text, sizeof(text));
    port = ntohs(a.sin6_port);
  }
  ip = text;
}

// A socket httplib reads requests from and writes responses to. Reads wait at most until the deadline of the
// current phase (the request head, then its body), and the head may not exceed kMaxHeaderBytes. Reads are
// buffered: httplib reads the head one byte at a time.
class DeadlineSocketStream : public httplib::Stream {
 public:
  DeadlineSocketStream(socket_t sock, std::chrono::seconds write_timeout)
      : sock_(sock), write_timeout_(write_timeout) {}

  // A new request begins: its head must be complete by `deadline`.
  void start_head(Clock::time_point deadline) {
    deadline_ = deadline;
    head_bytes_left_ = kMaxHeaderBytes;
  }
  // The head is parsed: the body must be complete by `deadline`.
  void start_body(Clock::time_point deadline) {
    deadline_ = deadline;
    head_bytes_left_ = SIZE_MAX;
  }
  bool has_buffered_bytes() const { return begin_ < end_; }
  // A read hit its phase's deadline or the head limit: the connection is not worth keeping.
  bool broken() const { return broken_; }

  bool is_readable() const override { return has_buffered_bytes() || wait_for(sock_, POLLIN, deadline_); }
  bool is_writable() const override { return wait_for(sock_, POLLOUT, Clock::now() + write_timeout_); }

  ssize_t read(char* ptr, size_t size) override {
    if (begin_ == end_) {
      if (!wait_for(sock_, POLLIN, deadline_)) {
        broken_ = true;
        return -1;
      }
      ssize_t n;
      do {
        n = ::recv(sock_, buffer_.data(), buffer_.size(), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    size = std::min(size, end_ - begin_);
    if (head_bytes_left_ != SIZE_MAX) {
      if (size > head_bytes_left_) {
        broken_ = true;
        return -1;
      }
      head_bytes_left_ -= size;
    }
    std::memcpy(ptr, buffer_.data() + begin_, size);
    begin_ += size;
    return static_cast<ssize_t>(size);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &length) == 0) describe(addr, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &length) == 0) describe(addr, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  socket_t sock_;
  std::chrono::seconds write_timeout_;
  Clock::time_point deadline_ = Clock::now();
  size_t head_bytes_left_ = kMaxHeaderBytes;
  bool broken_ = false;
  std::array<char, 4096> buffer_{};
  size_t begin_ = 0, end_ = 0;
};

// httplib's task queue for accepted connections: one thread per connection served. When every thread has a
// connection the accept thread runs the task itself with t_rejecting set, which answers 503 instead of queueing.
class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t threads) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lock(mutex_);
      // Connections queued or being served; a queued one is taken by a thread as soon as it waits (threads that
      // are still starting up count as free).
      if (connections_ < threads_.size()) {
        ++connections_;
        jobs_.push_back(std::move(fn));
        ready_.notify_one();
        return;
      }
    }
    t_rejecting = true;
    fn();
    t_rejecting = false;
  }

  void shutdown() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every accepted connection has been served
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
      --connections_;
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  size_t connections_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

GuardedHttpServer::GuardedHttpServer(ConnectionLimits limits, std::string reject_body, std::function<void()> on_reject)
    : limits_(limits), on_reject_(std::move(on_reject)) {
  reject_response_ = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: " +
                     std::to_string(limits_.retry_after_seconds) +
                     "\r\nConnection: close\r\nContent-Length: " + std::to_string(reject_body.size()) + "\r\n\r\n" +
                     reject_body;
  const auto threads = static_cast<size_t>(std::max(1, limits_.max_connections));
  new_task_queue = [threads] { return new ConnectionPool(threads); };
}

bool GuardedHttpServer::client_connected() {
  if (t_client_socket == INVALID_SOCKET) return true;
  pollfd p{t_client_socket, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return true;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0;
}

bool GuardedHttpServer::wait_for_request(socket_t sock) const {
  // In slices, so that an idle connection notices stop() (which closes the listening socket) within one.
  constexpr auto kSlice = std::chrono::milliseconds(100);
  const auto deadline = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
  while (svr_sock_ != INVALID_SOCKET) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (wait_for(sock, POLLIN, std::min(deadline, now + kSlice))) return true;
  }
  return false;
}

bool enable_tcp_keepalive(socket_t sock, std::chrono::seconds idle) {
  const int on = 1, seconds = static_cast<int>(std::clamp<int64_t>(idle.count(), 1, 32767));
  return ::setsockopt(sock, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) == 0 &&
         ::setsockopt(sock, IPPROTO_TCP, TCP_KEEPIDLE, &seconds, sizeof(seconds)) == 0 &&
         ::setsockopt(sock, IPPROTO_TCP, TCP_KEEPINTVL, &seconds, sizeof(seconds)) == 0;
}

void GuardedHttpServer::reject(socket_t sock) const {
  // Runs on the accept thread: nothing here may block. The socket's send buffer is empty, so the short
  // response fits; reading what the client already sent before closing avoids a reset that could discard it.
  (void)::send(sock, reject_response_.data(), reject_response_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(sock, SHUT_WR);
  char sink[4096];
  while (::recv(sock, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
  }
  ::close(sock);
  if (on_reject_) on_reject_();
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  if (t_rejecting) {
    reject(sock);
    return false;
  }
  if (limits_.tcp_keepalive_idle.count() > 0) (void)enable_tcp_keepalive(sock, limits_.tcp_keepalive_idle);
  DeadlineSocketStream stream(sock, std::chrono::seconds(write_timeout_sec_));
  t_client_socket = sock;
  bool ok = false;
  for (size_t left = keep_alive_max_count_; left > 0; --left) {
    // Idle until the next request's first byte; from there its head has header_timeout.
    if (!stream.has_buffered_bytes() && !wait_for_request(sock)) break;
    stream.start_head(Clock::now() + limits_.header_timeout);
    bool closed = false;
    ok = process_request(stream, /*close_connection=*/left == 1, closed,
                         [&](httplib::Request&) { stream.start_body(Clock::now() + limits_.read_timeout); });
    if (!ok || closed || stream.broken()) break;
  }
  t_client_socket = INVALID_SOCKET;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace kiln
