// The ranks' start-up channel: rank 0 listens on MASTER_ADDR:MASTER_PORT, the others connect (retrying until a
// timeout), and through the star they exchange small blobs — the NCCL unique id, CUDA IPC handles, probe verdicts.
// Plain TCP with no NCCL or CUDA in it, so it is tested on the CPU. Not for the data path: every call is
// blocking and every rank must make the same calls in the same order.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::nccl {

struct RendezvousSpec {
  std::string addr = "127.0.0.1";
  int port = 0;
  int rank = 0;
  int world_size = 1;
  // How long rank 0 waits for everyone to connect, the others keep retrying, and any later exchange may wait.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

class TcpBootstrap {
 public:
  // Connects the group; world size 1 opens no socket. Errors name the address, the port and the missing ranks.
  static Result<std::unique_ptr<TcpBootstrap>> connect(const RendezvousSpec& spec);
  ~TcpBootstrap();
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const { return spec_.rank; }
  int world_size() const { return spec_.world_size; }

  // Every rank's `mine`, in rank order, on every rank.
  Result<std::vector<std::string>> all_gather(const std::string& mine);
  // Rank 0's `blob` on every rank (the others' argument is ignored).
  Result<std::string> broadcast(const std::string& blob);
  Status barrier();

 private:
  explicit TcpBootstrap(RendezvousSpec spec) : spec_(std::move(spec)) {}
  std::string where() const;

  RendezvousSpec spec_;
  std::vector<int> peer_fds_;  // rank 0: one per rank (−1 for itself); others: one, to rank 0
};

}  // namespace kiln::nccl
