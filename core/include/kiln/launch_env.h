// Where this process sits in the group: rank, world size, local rank and the rendezvous address, read from the
// torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) that `torchrun`, a launcher
// script or `kiln serve` itself sets for each rank's process. No variable at all means one rank.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "kiln/status.h"
#include "kiln/tcp_bootstrap.h"

namespace kiln {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: none given (one rank needs none)
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(300)};
};

// Reads a variable; nullopt when unset. The real one wraps getenv; tests pass a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Parses the launch variables; every error names the variable and its value. KILN_RENDEZVOUS_TIMEOUT_S (seconds,
// default 300) bounds how long ranks wait for each other at start-up.
Result<LaunchEnv> read_launch_env(const EnvLookup& env);

// Where this process meets the others: the launch's address, port, rank, world size and timeout.
RendezvousSpec rendezvous_spec(const LaunchEnv& launch);

}  // namespace kiln
