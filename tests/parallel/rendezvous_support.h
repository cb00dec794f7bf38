// What the process-rank tests share: a loopback port that was free a moment ago, and a rendezvous spec for it.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "kiln/tcp_bootstrap.h"

namespace kiln::testing {

inline int free_port() {
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
