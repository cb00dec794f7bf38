// One process per tensor-parallel rank. Rank 0 runs the engine, the scheduler and the server as with one rank; its
// ModelInstance (RankLeaderInstance) runs each call on its own rank and forwards it, over a control channel, to the
// other ranks' processes, which execute it on their shard (run_rank_follower) until told to stop. The ranks meet
// inside the call through the collective (`socket` on CPU ranks, `nccl` on GPUs).
//
// What crosses the control channel is what a call reads on the host: the steps (tokens, positions, block tables,
// media rows), the step options, the MTP hidden rows, embedding ids, lm_head rows, and the cache pool's geometry.
// Token selection is rank 0's alone (as with ranks as threads): the others stop at their logits. Every follower
// holds a KV pool of its own with the geometry of rank 0's, so the block ids rank 0's scheduler hands out work in
// it; the first call that names a pool allocates its mirror.
//
// Failure: a call that fails on any rank fails on rank 0 naming the rank. A follower whose call failed reports why
// and exits (its connections close, so ranks waiting for it in a collective fail at once instead of waiting out
// a timeout); from then on every call fails with that reason — the group cannot be resumed and the server answers
// requests with the error. Rank 0 exiting closes the channel, and the followers exit.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/launch_env.h"
#include "kiln/tcp_bootstrap.h"
#include "model/model_instance.h"

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
  // collective (closes the collective's connections).
  RankLeaderInstance(std::unique_ptr<ModelInstance> own, std::unique_ptr<TcpBootstrap> control,
                     std::function<void()> release = {});
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

 private:
  // Sends `call` to every follower, runs `mine`, then collects the followers' verdicts.
  Status on_all_ranks(const std::string& call, const std::function<Status()>& mine);
  void mark_broken(const Status& why);

  std::unique_ptr<ModelInstance> own_;
  std::unique_ptr<TcpBootstrap> control_;
  std::function<void()> release_;
  std::mutex mu_;  // one call at a time (the engine's loop and a drafter's services may both call)
  Status broken_;
};

// A follower's loop: executes rank 0's calls on `model` until rank 0 says stop (returns OK) or goes away, or a call
// fails here (both return the error, after reporting it to rank 0). `layout` formats the mirrored pools' latents.
Status run_rank_follower(ModelInstance& model, TcpBootstrap& control, const KvLayout* layout);

}  // namespace kiln
