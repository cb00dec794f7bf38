#include "model/tensor_parallel_instance.h"

#include <thread>

namespace kiln {

TensorParallelInstance::TensorParallelInstance(std::unique_ptr<builtin::InprocGroup> group, std::vector<Rank> ranks)
    : group_(std::move(group)), ranks_(std::move(ranks)), scratch_(ranks_.size()), mtp_scratch_(ranks_.size()),
      buffers_(ranks_.size()) {}

TensorParallelInstance::~TensorParallelInstance() {
  // Instances first (their weights may view their sources), then the sources and endpoints, then the group.
  for (Rank& r : ranks_) r.instance.reset();
}

size_t TensorParallelInstance::weight_bytes() const {
  size_t total = 0;
  for (const Rank& r : ranks_) total += r.instance->weight_bytes();
  return total;
}

Status TensorParallelInstance::on_all_ranks(const std::function<Status(int)>& fn) {
  const int W = world();
  std::vector<Status> results(W);
  auto run = [&](int r) {
    results[r] = fn(r);
    if (!results[r].ok()) group_->abort("rank " + std::to_string(r) + ": " + results[r].message());
  };
  std::vector<std::thread> threads;
  threads.reserve(W - 1);
  for (int r = 1; r < W; ++r) threads.emplace_back(run, r);
  run(0);
  for (std::thread& t : threads) t.join();
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
  group_->reset();
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
