#include "runtime/cuda/step_timer.h"

namespace kiln::cuda {

StepTimer::~StepTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

cudaEvent_t StepTimer::event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    events_.push_back(e);
  }
  return events_[i];
}

void StepTimer::begin(cudaStream_t stream) {
  labels_.clear();
  stream_ = enabled ? stream : nullptr;
  if (stream_) cudaEventRecord(event(0), stream_);
}

void StepTimer::mark(const char* label) {
  if (!stream_) return;
  labels_.push_back(label);
  cudaEventRecord(event(labels_.size()), stream_);
}

void StepTimer::finish() {
  if (!stream_) return;
  for (size_t i = 0; i < labels_.size(); ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, events_[i], events_[i + 1]);
    auto it = totals_.begin();
    while (it != totals_.end() && it->first != labels_[i]) ++it;
    if (it == totals_.end()) totals_.emplace_back(labels_[i], ms);
    else it->second += ms;
  }
  ++steps_;
  stream_ = nullptr;
}

}  // namespace kiln::cuda
