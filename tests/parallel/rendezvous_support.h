// What the process-rank tests share: a loopback port that was free a moment ago, and a rendezvous spec for it.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>

#include "kiln/tcp_bootstrap.h"

namespace kiln::testing {

// A port below Linux's ephemeral range (32768–60999): a port the kernel hands out for bind(0) is one it also hands to
// other tests' outgoing connections, which under ctest -j took a rank 0's port between this probe and its listen
// ("Address already in use", or a rank connecting to another test's listener). Random in [20000, 32000), checked
// bindable; bind(0) only if 200 tries find none.
inline bool port_bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

inline int free_port() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 2654435761u ^
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int i = 0; i < 200; ++i) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    if (port_bindable(port)) return port;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

inline RendezvousSpec spec_for(int port, int rank, int world) {
  RendezvousSpec s;
  s.port = port;
  s.rank = rank;
  s.world_size = world;
  s.timeout = std::chrono::seconds(20);
  return s;
}

}  // namespace kiln::testing
