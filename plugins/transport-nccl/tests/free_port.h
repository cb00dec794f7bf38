// A TCP port on 127.0.0.1 that was free a moment ago, for tests that start a rendezvous: below the kernel's
// ephemeral range, as the launcher picks them (parallel/loopback_ports.h says why not bind(0)); 0 if none was found.
#pragma once

#include "parallel/loopback_ports.h"

namespace kiln::nccl::testing {

inline int free_loopback_port() {
  const Result<int> port = kiln::free_loopback_ports(1);
  return port.ok() ? *port : 0;
}

}  // namespace kiln::nccl::testing
