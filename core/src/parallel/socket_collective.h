// The built-in `socket` collective: CPU ranks in separate processes (one per rank, possibly on other machines),
// meeting over the TCP star of the start-up channel (kiln/tcp_bootstrap.h). Every call sends each rank's operand to
// rank 0, which combines them in rank order 0, 1, …, W−1 — fp32 accumulation, bf16 rounded once at the end, the
// arithmetic of the in-process group (builtin/inproc_collective.h) and of the GPU custom all-reduce — and sends each
// rank its result, so every rank gets the same bits as every other and as the ranks-as-threads path.
//
// It exists so that one process per rank (parallel/rank_processes.h, the launcher in `kiln serve`/`generate`) runs
// and is tested without a GPU; on GPUs the `nccl` collective takes its place unchanged. Host memory only.
//
// Calls and aborts. The rank processes run a *call* (a step, an embedding, …) on every rank at once, each rank meeting
// the others in a sequence of collectives; a call can fail on one rank alone (its step returns an error between two
// meetings). Then the others must not wait for it, and the group must stay usable. So every message a rank sends to
// rank 0 starts with a status word: an operand, or "this rank has left the call" with its verdict. A rank whose call
// ended — well or not — says so with end_call(); rank 0, meeting a rank that has left, fails that meeting on every
// rank still in it (naming the rank and its reason), their calls fail and they end their calls too; end_call is a
// last meeting where rank 0 collects every rank's verdict and tells all of them the group's. After it every rank is
// at the same point again and the next call runs normally. A rank that is gone (its connection closed, a timeout,
// a corrupt stream) cannot be resumed: the collective is then broken for good, shuts its connections so that every
// other rank sees it at once, and every later call fails.
//
// A rank that hangs (alive, but never reaching a meeting or the end of a call) is bounded by the call timeout
// (transport.timeout_s): rank 0 waits that long for every rank's operand in a meeting (and for every rank's end of a
// call), then fails the meeting on every rank that did arrive with an error naming the collective, the meeting, the
// call and the ranks that did not arrive, and breaks the group. The other ranks wait twice as long for rank 0, so
// that it is rank 0 (which sees every rank) that names the missing ones — unless rank 0 is the rank that hangs.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "kiln/collective.h"
#include "kiln/recipe.h"
#include "kiln/tcp_bootstrap.h"

namespace kiln {

class SocketCollective final : public Collective {
 public:
  // Over a connected group (its ranks and world size are the group's). `call_timeout`: how long rank 0 waits for a
  // rank in a meeting or at the end of a call (0: the channel's timeout, the rendezvous timeout).
  explicit SocketCollective(std::unique_ptr<TcpBootstrap> channel,
                            std::chrono::milliseconds call_timeout = std::chrono::milliseconds(0));
  ~SocketCollective() override;
  static Result<std::unique_ptr<SocketCollective>> connect(
      const RendezvousSpec& spec, std::chrono::milliseconds call_timeout = std::chrono::milliseconds(0));

  int rank() const override { return channel_->rank(); }
  int world_size() const override { return channel_->world_size(); }
  Status all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) override;
  Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) override;
  Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, Stream stream) override;
  Status broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) override;

  // Ends this rank's part of the current call in every group it meets in (the tensor-parallel group first, then its
  // decode-context group, if any) and returns the call's verdict as the first group's rank 0 sees it: OK, or the
  // first rank's own failure ("rank r: …"; a rank whose error only came from a meeting another rank failed is
  // named only when no rank failed on its own). `mine` is how the call went on this rank. Every rank of every
  // group must call it once per call, including when the call went well. All groups are ended together, so that
  // a rank leading one group and waiting in another cannot deadlock.
  static Status end_call(std::span<SocketCollective* const> groups, const Status& mine);
  // Not OK once a rank is gone: the group cannot go on (every call fails with this).
  const Status& broken() const { return broken_; }

  TcpBootstrap& channel() { return *channel_; }
  std::chrono::milliseconds call_timeout() const { return call_timeout_; }

 private:
  struct Call;
  struct Left;
  // One meeting: this rank's operand goes to rank 0, which hands `combine` every rank's (in rank order) and sends
  // rank r the r-th string it returns; the result of this rank comes back.
  Result<std::string> meet(const Call& call, std::string operand);
  // Records why the group cannot go on, and closes the connections so that every other rank learns it at once.
  Status break_group(const Status& why);
  // end_call's phases.
  Status announce_end(const Status& mine, bool primary);
  Status take_message_while_ending(int peer, const Status& mine);
  Status send_verdict(const Status& mine, bool primary);
  Status receive_verdict();
  // Rank 0: waits until each of `ranks` has a message (or closed its connection) or `deadline` passes; the ranks
  // that have neither by then.
  std::vector<int> not_arrived(std::vector<int> ranks, std::chrono::steady_clock::time_point deadline) const;
  // What a rank other than 0 waits for rank 0's answer.
  std::chrono::milliseconds leader_wait() const { return 2 * call_timeout_; }

  std::unique_ptr<TcpBootstrap> channel_;
  std::chrono::milliseconds call_timeout_;
  Status broken_;
  uint32_t call_ = 0;            // calls this rank has ended: every message carries it, so ranks out of step are caught
  bool meeting_failed_ = false;  // a meeting of this call failed here (so this rank's error may not be its own)
  std::vector<std::unique_ptr<Left>> left_;  // rank 0: the ranks that have left this call, with their verdicts
};

// The registry's factory: this process's rank, world size and rendezvous from the torchrun-style launch
// environment (kiln/launch_env.h), the call timeout from [transport] timeout_s; world size 1 opens no socket.
Result<std::unique_ptr<Collective>> create_socket_collective(const CreateContext& context);

// [transport] timeout_s: the key `socket` declares (the `nccl` collective declares its own, alike).
KeySpec transport_timeout_key();
// "all_reduce of 4096 bf16 in call 17: rank(s) 1, 3 did not arrive within transport.timeout_s = 5 s"
std::string missing_ranks_message(const std::string& meeting, const std::vector<int>& missing,
                                  std::chrono::milliseconds timeout);

}  // namespace kiln
