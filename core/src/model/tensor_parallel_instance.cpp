#include "model/tensor_parallel_instance.h"

#include <string>

namespace kiln {

Status check_decode_context_groups(int world, int context) {
  if (context > 1 && world % context != 0)
    return invalid_argument("parallel.decode_context = " + std::to_string(context) + " does not divide parallel.tensor = " +
                            std::to_string(world) + " (decode-context groups are consecutive tensor-parallel ranks)");
  return ok_status();
}

Status check_rank_process_group(const BuildContext& ctx) {
  const int world = ctx.collective ? ctx.collective->world_size() : 1;
  if (world != ctx.tensor_parallel)
    return invalid_argument("the collective spans " + std::to_string(world) + " processes and parallel.tensor = " +
                            std::to_string(ctx.tensor_parallel) + " (× parallel.decode_context within it): one "
                            "process per tensor-parallel rank, so WORLD_SIZE must equal parallel.tensor");
  return ok_status();
}

Result<std::vector<std::unique_ptr<builtin::InprocGroup>>> TensorParallelInstance::make_context_groups(int world,
                                                                                                       int context) {
  KILN_RETURN_IF_ERROR(check_decode_context_groups(world, context));
  std::vector<std::unique_ptr<builtin::InprocGroup>> groups;
  if (context > 1)
    for (int g = 0; g < world / context; ++g) groups.push_back(std::make_unique<builtin::InprocGroup>(context));
  return groups;
}

TensorParallelInstance::TensorParallelInstance(std::unique_ptr<builtin::InprocGroup> group,
                                               std::vector<std::unique_ptr<builtin::InprocGroup>> context_groups,
                                               std::vector<Rank> ranks)
    : group_(std::move(group)), context_groups_(std::move(context_groups)), ranks_(std::move(ranks)), results_(ranks_.size()), scratch_(ranks_.size()),
      mtp_scratch_(ranks_.size()), buffers_(ranks_.size()) {
  for (int r = 1; r < world(); ++r) workers_.emplace_back(&TensorParallelInstance::worker, this, r);
}

TensorParallelInstance::~TensorParallelInstance() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
  // Instances first (their weights may view their sources), then the sources and endpoints, then the group.
  for (Rank& r : ranks_) r.instance.reset();
}

void TensorParallelInstance::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<Status(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || job_id_ != seen; });
      if (stopping_) return;
      seen = job_id_;
      job = job_;
    }
    Status s = (*job)(rank);
    if (!s.ok()) abort_groups("rank " + std::to_string(rank) + ": " + s.message());
    std::lock_guard<std::mutex> lock(mu_);
    results_[rank] = std::move(s);
    if (--pending_ == 0) done_.notify_all();
  }
}

void TensorParallelInstance::abort_groups(const std::string& why) {
  group_->abort(why);
  for (auto& g : context_groups_) g->abort(why);
}

void TensorParallelInstance::reset_groups() {
  group_->reset();
  for (auto& g : context_groups_) g->reset();
}

size_t TensorParallelInstance::weight_bytes() const {
  size_t total = 0;
  for (const Rank& r : ranks_) total += r.instance->weight_bytes();
  return total;
}

Status TensorParallelInstance::on_all_ranks(const std::function<Status(int)>& fn) {
  const int W = world();
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = W - 1;
    ++job_id_;
  }
  wake_.notify_all();
  Status mine = fn(0);
  if (!mine.ok()) abort_groups("rank 0: " + mine.message());
  std::vector<Status> results;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    results_[0] = std::move(mine);
    results = results_;
  }
  // A rank that failed on its own says why; the others only report the abort that released them.
  const Status* first = nullptr;
  for (const Status& s : results) {
    if (s.ok()) continue;
    if (!first) first = &s;
    if (s.message().find("tensor-parallel group aborted") == std::string::npos) {
      first = &s;
      break;
    }
  }
  if (!first) return ok_status();
  Status failed = *first;
  reset_groups();
  return failed;
}

Status TensorParallelInstance::step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select,
                                    const CacheViews& caches, const StepOptions& options, StepOutput& out) {
  return on_all_ranks([&](int r) {
    // Token selection (and its sampling) happens once, on rank 0's logits; the others stop at their logits.
    if (r == 0) return ranks_[0].instance->step(steps, select, caches, options, out);
    return ranks_[r].instance->step(steps, {}, caches, options, scratch_[r]);
  });
}

Status TensorParallelInstance::mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden,
                                        const CacheViews& caches, MtpStepOutput& out) {
  return on_all_ranks([&](int r) {
    return ranks_[r].instance->mtp_step(layer, steps, hidden, caches, r == 0 ? out : mtp_scratch_[r]);
  });
}

Status TensorParallelInstance::embed(const int32_t* ids, int64_t n, TensorView out) {
  return on_all_ranks([&](int r) {
    if (r == 0) return ranks_[0].instance->embed(ids, n, out);
    buffers_[r].resize(static_cast<size_t>(out.numel()));
    TensorView mine = out;
    mine.data = buffers_[r].data();
    return ranks_[r].instance->embed(ids, n, mine);
  });
}

Status TensorParallelInstance::lm_head(const TensorView& hidden, float* logits) {
  const int64_t rows = hidden_size() > 0 ? hidden.numel() / hidden_size() : 0;
  return on_all_ranks([&](int r) {
    if (r == 0) return ranks_[0].instance->lm_head(hidden, logits);
    buffers_[r].resize(static_cast<size_t>(rows * vocab_size()));
    return ranks_[r].instance->lm_head(hidden, buffers_[r].data());
  });
}

}  // namespace kiln
