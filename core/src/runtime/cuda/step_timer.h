// Where a step's GPU time goes, by stage: CUDA events recorded between the blocks a step enqueues, summed per
// stage label over the steps timed. Only for steps launched directly (a captured graph would bake the events
// in); the time between two marks includes the launch gaps, so the stages sum to the step's stream time.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

namespace kiln::cuda {

class StepTimer {
 public:
  ~StepTimer();
  // Starts a step's marks on `stream` (a no-op unless enabled).
  void begin(cudaStream_t stream);
  // Ends the stage that began at the previous mark, charging it to `label`.
  void mark(const char* label);
  // After the stream has synchronised: adds the step's stage times to the totals.
  void finish();

  bool enabled = false;
  bool active() const { return enabled && stream_ != nullptr; }
  // Milliseconds per stage label, summed over the steps since the last clear, in first-seen order.
  const std::vector<std::pair<std::string, double>>& totals() const { return totals_; }
  int64_t steps() const { return steps_; }
  void clear() { totals_.clear(), steps_ = 0; }

 private:
  cudaEvent_t event(size_t i);
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> labels_;  // labels_[i] names the stage ending at events_[i + 1]
  std::vector<std::pair<std::string, double>> totals_;
  int64_t steps_ = 0;
};

}  // namespace kiln::cuda
