// What the process-rank tests share: a loopback port that was free a moment ago, and a rendezvous spec for it.
#pragma once

#include <chrono>

#include "kiln/tcp_bootstrap.h"
#include "parallel/loopback_ports.h"

namespace kiln::testing {

// A port below the kernel's ephemeral range that was bindable a moment ago (parallel/loopback_ports.h says why not
// bind(0)); 0, which no rendezvous accepts, if none was found.
inline int free_port() {
  const Result<int> port = free_loopback_ports(1);
  return port.ok() ? *port : 0;
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
