// Tensor parallelism with CPU ranks: W rank instances, each holding its part of the weights, run every call together
// on W threads of this process and meet through an in-process group (builtin/inproc_collective.h). The engine sees
// one ModelInstance: it hands over one set of KV pages (the ranks share it; rank 0 writes, see MlaMoeModel) and gets
// rank 0's outputs, which every rank has computed identically.
//
// This is how parallel.tensor > 1 runs on the CPU (transport.backend = "local"): the sharding math of the GPU ranks,
// provable on any machine. With parallel.decode_context = D the ranks also meet in groups of D consecutive ranks
// (one in-process group each) that split the KV by token (MlaMoeModel::set_decode_context). A call that fails on
// one rank aborts every group so the others return instead of waiting.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <span>
#include <string>
#include <vector>

#include "builtin/inproc_collective.h"
#include "kiln/weight_format.h"
#include "model/model_instance.h"

namespace kiln {

// parallel.decode_context = `context` over `world` tensor-parallel ranks: groups of consecutive ranks, so `context`
// must divide `world` (refused naming both keys otherwise).
Status check_decode_context_groups(int world, int context);
// One process per tensor-parallel rank: ctx.collective must span parallel.tensor processes (WORLD_SIZE).
Status check_rank_process_group(const BuildContext& ctx);

class TensorParallelInstance final : public ModelInstance {
 public:
  // The ranks' pieces: the group, each rank's endpoint and weight source (which its weights may view) and instance.
  struct Rank {
    std::unique_ptr<Collective> collective;
    std::unique_ptr<Collective> context_collective;  // its decode-context group's (none without one)
    std::unique_ptr<WeightSource> source;
    std::unique_ptr<ModelInstance> instance;
  };
  // `context_groups`: the decode-context groups the ranks' context_collective endpoints belong to (may be empty).
  TensorParallelInstance(std::unique_ptr<builtin::InprocGroup> group,
                         std::vector<std::unique_ptr<builtin::InprocGroup>> context_groups, std::vector<Rank> ranks);
  ~TensorParallelInstance() override;
  // The in-process decode-context groups of `context` consecutive ranks each (none when context ≤ 1); rank r's
  // endpoint is groups[r / context]->endpoint(r % context).
  static Result<std::vector<std::unique_ptr<builtin::InprocGroup>>> make_context_groups(int world, int context);

  int world() const { return static_cast<int>(ranks_.size()); }
  ModelInstance& rank(int r) { return *ranks_[r].instance; }
  // What rank r ≥ 1 computed in the last step (rank 0's is what step returned; the ranks compute the same values, and
  // tests compare them).
  const StepOutput& rank_output(int r) const { return scratch_[r]; }

  Device device() const override { return ranks_[0].instance->device(); }
  DeviceContext& device_context() override { return ranks_[0].instance->device_context(); }
  size_t weight_bytes() const override;
  int64_t vocab_size() const override { return ranks_[0].instance->vocab_size(); }
  int64_t hidden_size() const override { return ranks_[0].instance->hidden_size(); }
  int64_t num_mtp_layers() const override { return ranks_[0].instance->num_mtp_layers(); }
  // Every rank runs the same kernels over the same rows: rank 0 speaks for the group.
  BatchInvariance batch_invariance() const override { return ranks_[0].instance->batch_invariance(); }
  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const CacheViews& caches,
              const StepOptions& options, StepOutput& out) override;
  Status mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, const CacheViews& caches,
                  MtpStepOutput& out) override;
  Status embed(const int32_t* ids, int64_t n, TensorView out) override;
  Status lm_head(const TensorView& hidden, float* logits) override;
  // Host sampling reads rank 0's outputs only: no rank meets another.
  Status sample_drafts(const DraftSampleRequest& request) override { return ranks_[0].instance->sample_drafts(request); }

 private:
  // Runs fn(r) for every rank at once (rank 0 on the calling thread); the first rank's own failure is returned.
  Status on_all_ranks(const std::function<Status(int)>& fn);

  // Ranks 1.. live on threads of their own for the instance's life, each waiting for the next call.
  void worker(int rank);
  // Releases every rank waiting in any group (a rank failed), and re-arms them all once no rank is inside a call.
  void abort_groups(const std::string& why);
  void reset_groups();

  std::unique_ptr<builtin::InprocGroup> group_;
  std::vector<std::unique_ptr<builtin::InprocGroup>> context_groups_;
  std::vector<Rank> ranks_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<Status(int)>* job_ = nullptr;
  uint64_t job_id_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<Status> results_;
  std::vector<std::thread> workers_;
  std::vector<StepOutput> scratch_;          // ranks 1.. write their (identical) outputs here
  std::vector<MtpStepOutput> mtp_scratch_;
  std::vector<std::vector<float>> buffers_;  // ranks 1..'s embed / lm_head outputs
};

}  // namespace kiln
