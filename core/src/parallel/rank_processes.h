// One process per tensor-parallel rank. Rank 0 runs the engine, the scheduler and the server as with one rank; its
// ModelInstance (RankLeaderInstance) runs each call on its own rank and forwards it, over a control channel, to the
// other ranks' processes, which execute it on their shard (run_rank_follower) until told to stop. The ranks meet
// inside the call through the collective (`socket` on CPU ranks, `nccl` on GPUs).
//
// What crosses the control channel is what a call reads on the host: the steps (tokens, positions, block tables,
// media rows), the step options, the MTP hidden rows, embedding ids, lm_head rows, and the cache pool's geometry. A
// drafter's chained step with its tokens on rank 0's device (SequenceStep::device_tokens) has them staged through
// rank 0's host first, and every rank, rank 0 included, runs it on those ids.
// Token selection is rank 0's alone (as with ranks as threads): the others stop at their logits. Every follower
// holds a KV pool of its own with the geometry of rank 0's, so the block ids rank 0's scheduler hands out work in
// it; the first call that names a pool allocates its mirror.
//
// Failure. With `socket` collectives (`groups` below) a call that fails on some ranks fails on all of them and the
// group carries on: every rank ends every call with SocketCollective::end_call, which releases the ranks still
// waiting in a meeting for one that failed, and rank 0's call returns the first rank's own error ("tensor-parallel
// rank r: …"); the next call runs as if nothing had happened. A rank that is gone (exited, killed, unreachable)
// breaks the group for good: rank 0 closes its connections so that every rank notices at once, the followers exit,
// and every later call fails with the reason (restart kiln) — the server keeps answering. Without `groups` (a
// collective that cannot abort a call, such as `nccl`) any failed call breaks the group that way. Rank 0 exiting
// closes the channel, and the followers exit.
//
// Start-up: every follower reports to rank 0, over the control channel, whether it built its shard
// (report_rank_loaded / wait_for_ranks_loaded), so a rank whose weights fail to load — on this machine or another —
// ends rank 0's start-up at once with its error, instead of rank 0 waiting for a rank that will never call back.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/launch_env.h"
#include "kiln/tcp_bootstrap.h"
#include "model/model_instance.h"
#include "parallel/socket_collective.h"

namespace kiln {

// Where the ranks' processes meet: MASTER_PORT the collective, MASTER_PORT + 1 the control channel, MASTER_PORT + 2 + g
// the decode-context group g (at the address of its first rank).
inline int control_port(const LaunchEnv& launch) { return launch.master_port + 1; }
inline int context_group_port(const LaunchEnv& launch, int group) { return launch.master_port + 2 + group; }

// Connects this rank to the control channel (rank 0 listens on MASTER_ADDR:MASTER_PORT + 1).
Result<std::unique_ptr<TcpBootstrap>> connect_control_channel(const LaunchEnv& launch);

class RankLeaderInstance final : public ModelInstance {
 public:
  // `own`: rank 0's instance. `release`: called once when the group breaks, to wake ranks that wait for rank 0 in a
  // collective (closes the collective's connections). `groups`: the `socket` collectives every call meets in (the
  // tensor-parallel group, then this rank's decode-context group), ended together after each call; empty when
  // the collective cannot abort a call.
  RankLeaderInstance(std::unique_ptr<ModelInstance> own, std::unique_ptr<TcpBootstrap> control,
                     std::function<void()> release = {}, std::vector<SocketCollective*> groups = {});
  ~RankLeaderInstance() override;  // tells the followers to stop

  int world() const { return control_->world_size(); }

  Device device() const override { return own_->device(); }
  DeviceContext& device_context() override { return own_->device_context(); }
  size_t weight_bytes() const override { return own_->weight_bytes(); }  // this process's
  int64_t vocab_size() const override { return own_->vocab_size(); }
  int64_t hidden_size() const override { return own_->hidden_size(); }
  int64_t num_mtp_layers() const override { return own_->num_mtp_layers(); }
  // Every rank runs the same kernels over the same rows: rank 0 speaks for the group.
  BatchInvariance batch_invariance() const override { return own_->batch_invariance(); }
  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const CacheViews& caches,
              const StepOptions& options, StepOutput& out) override;
  Status mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, const CacheViews& caches,
                  MtpStepOutput& out) override;
  Status embed(const int32_t* ids, int64_t n, TensorView out) override;
  Status lm_head(const TensorView& hidden, float* logits) override;
  // Host sampling reads rank 0's outputs only: no rank meets another.
  Status sample_drafts(const DraftSampleRequest& request) override { return own_->sample_drafts(request); }
  // Each follower holds its heads' state in a pool of its own: the copy is queued and sent with the next step (or
  // MTP step), which the follower makes in its pool before running the call.
  void mirror_state_copy(const StateCopy& copy) override;

 private:
  // Sends `call` to every follower, runs `mine`, then collects the followers' verdicts. `with_state_copies`: the
  // call (a step or an MTP step) carries the state copies queued since the last such call, right after its kind.
  Status on_all_ranks(std::string call, const std::function<Status()>& mine, bool with_state_copies = false);
  // Breaks the group for good (the first cause wins) and returns what this call and every later one answer.
  Status mark_broken(const Status& why);

  std::unique_ptr<ModelInstance> own_;
  std::unique_ptr<TcpBootstrap> control_;
  std::function<void()> release_;
  std::vector<SocketCollective*> groups_;
  std::mutex mu_;  // one call at a time (the engine's loop and a drafter's services may both call)
  std::mutex copies_mu_;
  std::vector<StateCopy> state_copies_;  // queued for the followers' next step
  Status broken_;
};

// A follower's loop: executes rank 0's calls on `model` until rank 0 says stop (returns OK) or goes away (returns
// the error). A call that fails here is reported to rank 0; with `groups` (as for RankLeaderInstance) the loop goes
// on with the next call unless the group broke, without them it returns the error. `layout` formats the mirrored
// pools' latents.
Status run_rank_follower(ModelInstance& model, TcpBootstrap& control, const KvLayout* layout,
                         std::vector<SocketCollective*> groups = {});

// The groups a call meets in when they are `socket` collectives (the tensor-parallel one, then the decode-context
// one if any); empty otherwise (those calls cannot be aborted: a failure breaks the group).
std::vector<SocketCollective*> socket_call_groups(Collective* tensor_parallel, Collective* decode_context);

// Called once when a RankLeaderInstance of this process finds its group broken (after it released the ranks waiting
// in a collective): the launcher (`kiln serve` / `generate`) stops the rank processes it started, so that a rank that
// hangs does not outlive the group. An empty function removes the handler.
void set_group_broken_handler(std::function<void(const Status&)> handler);

// Start-up over the control channel: a follower says whether it built its shard (`built`: OK or why not), rank 0
// waits until every follower has, and fails with the first that could not ("rank r could not load: …") or that
// went away. A follower that built its shard also says how many bytes of weights it holds (`weight_bytes`), and
// rank 0 gets the largest: the ranks' shards differ (the shared expert lives on the last rank, uneven splits), and
// the KV pool rank 0 sizes is mirrored on every rank, so it must fit beside the largest shard.
Status report_rank_loaded(TcpBootstrap& control, const Status& built, uint64_t weight_bytes = 0);
Result<uint64_t> wait_for_ranks_loaded(TcpBootstrap& control);

}  // namespace kiln
