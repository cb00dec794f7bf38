#include "kiln/tcp_bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'B', 'O', 'O', 'T'};
// A blob larger than this is a corrupt stream (the socket collective's activations stay far below it).
constexpr uint64_t kMaxBlob = uint64_t{4} << 30;

struct Hello {
  char magic[8];
  uint32_t rank;
  uint32_t world_size;
};
enum : uint32_t { kAccepted = 0, kWorldMismatch = 1, kDuplicateRank = 2 };

std::string errno_text(int e) {
  return std::strerror(e);
}

int remaining_ms(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;  // poll's "for ever"
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Waits until `fd` is ready for `events` or the deadline passes.
Status wait_fd(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return ok_status();
    if (n == 0) return unavailable("timed out " + what);
    if (errno != EINTR) return unavailable(what + ": poll: " + errno_text(errno));
  }
}

Status send_all(int fd, const void* data, size_t bytes, Clock::time_point deadline, const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    KILN_RETURN_IF_ERROR(wait_fd(fd, POLLOUT, deadline, "sending to " + peer));
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return unavailable("sending to " + peer + ": " + errno_text(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return ok_status();
}

Status recv_all(int fd, void* data, size_t bytes, Clock::time_point deadline, const std::string& peer) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    KILN_RETURN_IF_ERROR(wait_fd(fd, POLLIN, deadline, "waiting for " + peer));
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n == 0) return unavailable(peer + " closed the connection (did that process exit?)");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return unavailable("receiving from " + peer + ": " + errno_text(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return ok_status();
}

Status send_blob(int fd, const std::string& blob, Clock::time_point deadline, const std::string& peer) {
  const uint64_t size = blob.size();
  KILN_RETURN_IF_ERROR(send_all(fd, &size, sizeof size, deadline, peer));
  return send_all(fd, blob.data(), blob.size(), deadline, peer);
}

Result<std::string> recv_blob(int fd, Clock::time_point deadline, const std::string& peer) {
  uint64_t size = 0;
  KILN_RETURN_IF_ERROR(recv_all(fd, &size, sizeof size, deadline, peer));
  if (size > kMaxBlob) return data_loss(peer + " sent a " + std::to_string(size) + "-byte message (corrupt stream?)");
  std::string blob(size, '\0');
  KILN_RETURN_IF_ERROR(recv_all(fd, blob.data(), size, deadline, peer));
  return blob;
}

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}
void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

Status resolve(const std::string& addr, int port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  const int rc = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &out.list);
  if (rc != 0) return invalid_argument("cannot resolve MASTER_ADDR " + addr + ": " + ::gai_strerror(rc));
  return ok_status();
}

// One non-blocking connect attempt, bounded by the deadline; −1 and the errno on failure.
int try_connect(const addrinfo* ai, Clock::time_point deadline, int& err) {
  const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    err = errno;
    return -1;
  }
  set_nonblocking(fd);
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    err = errno;
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  const int n = ::poll(&p, 1, std::min(remaining_ms(deadline), 1000));
  int so_error = ETIMEDOUT;
  socklen_t len = sizeof so_error;
  if (n > 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
  if (so_error != 0) {
    err = so_error;
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string TcpBootstrap::where() const {
  return spec_.addr + ":" + std::to_string(spec_.port);
}

Result<std::unique_ptr<TcpBootstrap>> TcpBootstrap::connect(const RendezvousSpec& spec) {
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size)
    return invalid_argument("rendezvous: rank " + std::to_string(spec.rank) + " of world size " +
                            std::to_string(spec.world_size));
  std::unique_ptr<TcpBootstrap> b(new TcpBootstrap(spec));
  if (spec.world_size == 1) return b;
  if (spec.port < 1 || spec.port > 65535)
    return invalid_argument("rendezvous: port " + std::to_string(spec.port) + " (MASTER_PORT) is not in 1..65535");
  const auto deadline = Clock::now() + spec.timeout;
  const auto ms = spec.timeout.count();
  const std::string seconds = (ms % 1000 == 0 ? std::to_string(ms / 1000) : std::to_string(ms / 1000.0)) + " s";
  AddrInfo ai;

  if (spec.rank == 0) {
    KILN_RETURN_IF_ERROR(resolve(spec.addr, spec.port, true, ai));
    int listen_fd = -1, err = 0;
    for (addrinfo* a = ai.list; a && listen_fd < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        err = errno;
        continue;
      }
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, spec.world_size * 2) == 0) {
        listen_fd = fd;
      } else {
        err = errno;
        ::close(fd);
      }
    }
    if (listen_fd < 0)
      return unavailable("rank 0 cannot listen on " + b->where() + " (MASTER_ADDR:MASTER_PORT): " + errno_text(err) +
                         "; MASTER_ADDR must be an address of rank 0's machine and MASTER_PORT a free port");
    set_nonblocking(listen_fd);
    b->peer_fds_.assign(spec.world_size, -1);
    int joined = 1;
    Status failure;
    // Ranks already in that may have closed their connection: a readable one with nothing to read did. One that
    // has sent something (it went on to its first exchange) is not watched any more, so its bytes stay unread.
    std::vector<bool> watched(spec.world_size, true);
    while (joined < spec.world_size && failure.ok()) {
      std::vector<pollfd> fds{{listen_fd, POLLIN, 0}};
      for (int r = 1; r < spec.world_size; ++r)
        if (b->peer_fds_[r] >= 0 && watched[r]) fds.push_back({b->peer_fds_[r], POLLIN, 0});
      const int n = ::poll(fds.data(), fds.size(), remaining_ms(deadline));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      for (size_t i = 1; i < fds.size() && failure.ok(); ++i) {
        if (!fds[i].revents) continue;
        int gone = 0;
        for (int r = 1; r < spec.world_size; ++r)
          if (b->peer_fds_[r] == fds[i].fd) gone = r;
        char byte;
        const ssize_t got = ::recv(fds[i].fd, &byte, 1, MSG_PEEK);
        if (got > 0) {
          watched[gone] = false;
          continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        std::string missing;
        for (int r = 1; r < spec.world_size; ++r)
          if (b->peer_fds_[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        failure = unavailable("rank " + std::to_string(gone) + " connected to rank 0 at " + b->where() +
                              " (MASTER_ADDR:MASTER_PORT) and closed its connection before rank(s) " + missing +
                              " were in: it exited (its log, or its launcher, says why)");
      }
      if (!failure.ok() || !(fds[0].revents & POLLIN)) continue;
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      set_nonblocking(fd);
      set_nodelay(fd);
      Hello h{};
      // A client that is no rank (wrong magic, silent) is dropped; the wait for the real ones goes on.
      const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
      if (!recv_all(fd, &h, sizeof h, hello_deadline, "a connecting rank").ok() ||
          std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
        ::close(fd);
        continue;
      }
      uint32_t verdict = kAccepted;
      if (h.world_size != static_cast<uint32_t>(spec.world_size)) {
        verdict = kWorldMismatch;
        failure = invalid_argument("rank " + std::to_string(h.rank) + " connected to " + b->where() +
                                   " with WORLD_SIZE=" + std::to_string(h.world_size) +
                                   ", rank 0 has WORLD_SIZE=" + std::to_string(spec.world_size));
      } else if (h.rank == 0 || h.rank >= h.world_size || b->peer_fds_[h.rank] >= 0) {
        verdict = kDuplicateRank;
        failure = invalid_argument("two processes at " + b->where() + " claim RANK=" + std::to_string(h.rank));
      }
      const Status sent = send_all(fd, &verdict, sizeof verdict, deadline, "rank " + std::to_string(h.rank));
      if (verdict != kAccepted || !sent.ok()) {
        ::close(fd);
        continue;
      }
      b->peer_fds_[h.rank] = fd;
      ++joined;
    }
    ::close(listen_fd);
    if (!failure.ok()) return failure;
    if (joined < spec.world_size) {
      std::string missing;
      for (int r = 1; r < spec.world_size; ++r)
        if (b->peer_fds_[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return unavailable("rank 0 waited " + seconds + " at " + b->where() + " (MASTER_ADDR:MASTER_PORT) for rank(s) " +
                         missing +
                         " to connect; are they running with the same MASTER_ADDR, MASTER_PORT and "
                         "WORLD_SIZE=" +
                         std::to_string(spec.world_size) + "?");
    }
    return b;
  }

  // Ranks > 0: rank 0 may not be listening yet, so retry until the deadline.
  KILN_RETURN_IF_ERROR(resolve(spec.addr, spec.port, false, ai));
  int err = 0;
  for (;;) {
    int fd = -1;
    for (addrinfo* a = ai.list; a && fd < 0; a = a->ai_next) fd = try_connect(a, deadline, err);
    if (fd >= 0) {
      set_nodelay(fd);
      Hello h{};
      std::memcpy(h.magic, kMagic, sizeof kMagic);
      h.rank = static_cast<uint32_t>(spec.rank);
      h.world_size = static_cast<uint32_t>(spec.world_size);
      uint32_t verdict = 0;
      Status s = send_all(fd, &h, sizeof h, deadline, "rank 0 at " + b->where());
      if (s.ok()) s = recv_all(fd, &verdict, sizeof verdict, deadline, "rank 0 at " + b->where());
      if (!s.ok()) {
        ::close(fd);
        return s;
      }
      if (verdict != kAccepted) {
        ::close(fd);
        return invalid_argument("rank 0 at " + b->where() + " refused rank " + std::to_string(spec.rank) + ": " +
                                (verdict == kWorldMismatch
                                     ? "its WORLD_SIZE differs from " + std::to_string(spec.world_size)
                                     : "another process already has RANK=" + std::to_string(spec.rank)));
      }
      b->peer_fds_ = {fd};
      return b;
    }
    if (Clock::now() >= deadline)
      return unavailable("rank " + std::to_string(spec.rank) + " could not reach rank 0 at " + b->where() +
                         " (MASTER_ADDR:MASTER_PORT) within " + seconds + ": " + errno_text(err) +
                         "; is rank 0 running, and do all ranks use the same MASTER_ADDR and MASTER_PORT?");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, remaining_ms(deadline))));
  }
}

TcpBootstrap::~TcpBootstrap() {
  for (int fd : peer_fds_)
    if (fd >= 0) ::close(fd);
}

Result<std::vector<std::string>> TcpBootstrap::all_gather(const std::string& mine) {
  const int world = spec_.world_size;
  if (world == 1) return std::vector<std::string>{mine};
  const auto deadline = Clock::now() + spec_.timeout;
  std::vector<std::string> all(world);
  if (spec_.rank == 0) {
    all[0] = mine;
    for (int r = 1; r < world; ++r) {
      KILN_ASSIGN_OR_RETURN(all[r], recv_blob(peer_fds_[r], deadline, "rank " + std::to_string(r)));
    }
    for (int r = 1; r < world; ++r)
      for (const auto& blob : all)
        KILN_RETURN_IF_ERROR(send_blob(peer_fds_[r], blob, deadline, "rank " + std::to_string(r)));
    return all;
  }
  const std::string root = "rank 0 at " + where();
  KILN_RETURN_IF_ERROR(send_blob(peer_fds_[0], mine, deadline, root));
  for (auto& blob : all) {
    KILN_ASSIGN_OR_RETURN(blob, recv_blob(peer_fds_[0], deadline, root));
  }
  return all;
}

Result<std::string> TcpBootstrap::broadcast(const std::string& blob) {
  KILN_ASSIGN_OR_RETURN(auto all, all_gather(spec_.rank == 0 ? blob : std::string()));
  return std::move(all[0]);
}

Status TcpBootstrap::barrier() {
  return all_gather("").status();
}

}  // namespace kiln

namespace kiln {

Result<int> TcpBootstrap::peer_fd(int peer) const {
  const int world = spec_.world_size;
  if (peer < 0 || peer >= world || peer == spec_.rank || (spec_.rank != 0 && peer != 0))
    return invalid_argument("rank " + std::to_string(spec_.rank) + " has no connection to rank " + std::to_string(peer) +
                            " (the start-up channel is a star around rank 0)");
  return peer_fds_[spec_.rank == 0 ? peer : 0];
}

Status TcpBootstrap::send(int peer, const std::string& blob) {
  KILN_ASSIGN_OR_RETURN(const int fd, peer_fd(peer));
  const std::string who = peer == 0 ? "rank 0 at " + where() : "rank " + std::to_string(peer);
  return send_blob(fd, blob, Clock::now() + spec_.timeout, who);
}

Result<std::string> TcpBootstrap::receive(int peer, std::optional<std::chrono::milliseconds> timeout) {
  KILN_ASSIGN_OR_RETURN(const int fd, peer_fd(peer));
  const std::string who = peer == 0 ? "rank 0 at " + where() : "rank " + std::to_string(peer);
  const auto wait = timeout.value_or(spec_.timeout);
  const auto deadline = wait.count() < 0 ? Clock::time_point::max() : Clock::now() + wait;
  return recv_blob(fd, deadline, who);
}

int TcpBootstrap::native_handle(int peer) const {
  auto fd = peer_fd(peer);
  return fd.ok() ? *fd : -1;
}

void TcpBootstrap::shut_down() {
  for (int fd : peer_fds_)
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

std::string TcpBootstrap::local_address() const {
  if (spec_.rank == 0 || peer_fds_.empty() || peer_fds_[0] < 0) return spec_.addr;
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(peer_fds_[0], reinterpret_cast<sockaddr*>(&addr), &len) != 0) return spec_.addr;
  char host[INET6_ADDRSTRLEN] = {0};
  const void* raw = addr.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr)
                                               : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&addr)->sin_addr);
  if (!::inet_ntop(addr.ss_family, raw, host, sizeof host)) return spec_.addr;
  return host;
}

}  // namespace kiln
