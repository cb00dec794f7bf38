// The built-in `socket` collective: CPU ranks in separate processes (one per rank, possibly on other machines),
// meeting over the TCP star of the start-up channel (kiln/tcp_bootstrap.h). Every call sends each rank's operand to
// rank 0, which combines them in rank order 0, 1, …, W−1 — fp32 accumulation, bf16 rounded once at the end, the
// arithmetic of the in-process group (builtin/inproc_collective.h) and of the GPU custom all-reduce — and sends each
// rank its result, so every rank gets the same bits as every other and as the ranks-as-threads path.
//
// It exists so that one process per rank (parallel/rank_processes.h, the launcher in `kiln serve`/`generate`) runs
// and is tested without a GPU; on GPUs the `nccl` collective takes its place unchanged. Host memory only.
#pragma once

#include <memory>

#include "kiln/collective.h"
#include "kiln/tcp_bootstrap.h"

namespace kiln {

class SocketCollective final : public Collective {
 public:
  // Over a connected group (its ranks and world size are the group's).
  explicit SocketCollective(std::unique_ptr<TcpBootstrap> channel) : channel_(std::move(channel)) {}
  static Result<std::unique_ptr<SocketCollective>> connect(const RendezvousSpec& spec);

  int rank() const override { return channel_->rank(); }
  int world_size() const override { return channel_->world_size(); }
  Status all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) override;
  Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) override;
  Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, Stream stream) override;
  Status broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) override;

  TcpBootstrap& channel() { return *channel_; }

 private:
  struct Call;
  // One meeting: this rank's operand goes to rank 0, which hands `combine` every rank's (in rank order) and sends
  // rank r the r-th string it returns; the result of this rank comes back.
  Result<std::string> meet(const Call& call, std::string operand);

  std::unique_ptr<TcpBootstrap> channel_;
};

// The registry's factory: this process's rank, world size and rendezvous from the torchrun-style launch
// environment (kiln/launch_env.h); world size 1 opens no socket.
Result<std::unique_ptr<Collective>> create_socket_collective(const CreateContext& context);

}  // namespace kiln
