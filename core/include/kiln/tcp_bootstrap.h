// The ranks' start-up channel: rank 0 listens on MASTER_ADDR:MASTER_PORT, the others connect (retrying until a
// timeout), and through the star they exchange small blobs — the NCCL unique id, CUDA IPC handles, probe verdicts.
// Plain TCP with no NCCL or CUDA in it, so it is tested on the CPU. Every call is blocking. The collective calls
// (all_gather, broadcast, barrier) must be made by every rank in the same order; the point-to-point ones (send,
// receive) run between rank 0 and one other rank, which is all the star has: the CPU ranks' `socket` collective
// and the rank processes' control channel (parallel/) are built on them, where simplicity beats bandwidth.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln {

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
  // Rank 0 gives up at once, without waiting out the timeout, when a rank that had connected closes its connection
  // before the others arrive (it exited: its launcher or its log says why) — only ranks that never connect can
  // only be timed out.
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

  // Point to point along the star: rank 0 with any rank, any other rank with rank 0 only. `receive` waits at most
  // `timeout` (the rendezvous timeout when not given; a negative one waits for ever, for a rank idle between calls);
  // a peer that exited is reported at once (its connection closes).
  Status send(int peer, const std::string& blob);
  Result<std::string> receive(int peer, std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // This rank's address as rank 0 sees it (the local end of its connection; rank 0: MASTER_ADDR), so that a
  // sub-group led by another rank can meet at an address of that rank's machine.
  std::string local_address() const;
  std::chrono::milliseconds timeout() const { return spec_.timeout; }
  // The socket to `peer` (−1 if none), for waiting on several peers — of several channels — at once with poll(2);
  // reading and writing stay with receive and send.
  int native_handle(int peer) const;
  // Shuts every connection down (the object stays valid; its calls fail from now on), waking a thread of this
  // process blocked in a call, and peers blocked on this rank, at once.
  void shut_down();

 private:
  explicit TcpBootstrap(RendezvousSpec spec) : spec_(std::move(spec)) {}
  std::string where() const;
  Result<int> peer_fd(int peer) const;

  RendezvousSpec spec_;
  std::vector<int> peer_fds_;  // rank 0: one per rank (−1 for itself); others: one, to rank 0
};

}  // namespace kiln
