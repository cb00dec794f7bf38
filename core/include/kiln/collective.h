// Collective: communication among the ranks of a tensor-parallel group. `local` (built in) is world size 1;
// `nccl` (plugin) spans GPUs. Buffers are device pointers on the stream's device (host memory on the CPU).
// The engine creates one per rank (CreateContext::device on that rank's device) and hands it to every step in
// the step context; calls are enqueued on the compute stream and must be capturable in a CUDA graph.
#pragma once

#include <cstdint>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

enum class ReduceOp { kSum, kMax };

class Collective {
 public:
  static constexpr PluginKind kKind = PluginKind::kCollective;
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In place: every rank ends with the reduction of all ranks' `count` elements.
  virtual Status all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) = 0;
  // out[r·count .. (r+1)·count) = rank r's `in`.
  virtual Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) = 0;
  // in holds world_size·count elements; out[count] = reduction of every rank's r-th chunk, for this rank r.
  virtual Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, Stream stream) = 0;
  virtual Status broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) = 0;
};

}  // namespace kiln
