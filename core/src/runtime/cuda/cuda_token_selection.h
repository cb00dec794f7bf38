// Token selection of a CUDA step on the device (kernels/cuda/token_select): the selected entries' drafts, uniforms
// and sparse q go up (a few hundred bytes), the kernels read the step's logits where they are, and only the
// selected ids come back. Also the drafters' sampling (DraftServices::sample), which leaves its results on the device.
#pragma once

#include <cuda_runtime.h>

#include <span>

#include "kiln/draft_services.h"
#include "model/model_step.h"
#include "runtime/cuda/device_arena.h"

namespace kiln::cuda {

class DeviceTokenSelection {
 public:
  // logits: device [rows, vocab]; rows of constrained entries (TokenSelection::allowed) are masked in place. Waits
  // for the stream (the ids are on the host when it returns).
  Status select(float* logits, int64_t vocab, std::span<const int64_t> first_row,
                std::span<const TokenSelection> select, cudaStream_t stream, StepOutput& out);
  // Enqueued on `stream`; the request's outputs are device memory.
  Status sample_drafts(const DraftSampleRequest& request, int64_t vocab, cudaStream_t stream);

 private:
  StepScratch select_scratch_, draft_scratch_;
  PinnedHostBuffer staging_;
};

}  // namespace kiln::cuda
