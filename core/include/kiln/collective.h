// Collective: communication among the ranks of a tensor-parallel group. `local` (built in) is world size 1;
// `nccl` (plugin) spans GPUs. Buffers are device pointers on the stream's device (host memory on the CPU).
// The engine creates one per rank (CreateContext::device on that rank's device) and hands it to every step in
// the step context; calls are enqueued on the compute stream and must be capturable in a CUDA graph. Virtuals are
// only appended (the loader refuses collectives built before the newest one: the host calls it).
#pragma once

#include <cstdint>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

enum class ReduceOp { kSum, kMax };

// The MoE block's tensor-parallel sum fused with what follows it (all_reduce_moe_combine_norm). Device pointers.
// y: this rank's fp32 rows, n·top_k routed slots (token t's slot k at row t·top_k + k), then with `shared` n rows of
// the shared expert; every value has at most one rank with a non-zero contribution (the experts are split across
// ranks), so the ranks' sum is exact. For token t and column i, with Y the ranks' sum of y:
//   v = bf16(Σ_k Y[t·top_k + k][i] (fp32, slot order) + bf16(Y[n·top_k + t][i]) (with `shared`))
//   residual[t][i] += v (fp32);  normed[t] = RMSNorm(residual[t]) · norm_weight (bf16)
// with the SDK's row body (kiln/cuda/moe_combine_norm_row.cuh), so the bits are those of all_reduce followed by the
// core's combine + residual add + RMSNorm kernel.
struct MoeCombineNorm {
  const float* y = nullptr;
  int64_t n = 0, top_k = 0, hidden = 0;
  bool shared = false;
  float* residual = nullptr;
  const uint16_t* norm_weight = nullptr;
  float eps = 0.f;
  uint16_t* normed = nullptr;
};

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
  // ABI 2.6. The sum of `run.y` over the ranks and the combine + residual add + RMSNorm after it in one launch,
  // where this collective has such a path for the call (transport-nccl's custom all-reduce: decode-sized steps).
  // False, having done nothing, where it has not: the caller then runs all_reduce and its own kernel.
  virtual Result<bool> all_reduce_moe_combine_norm(const MoeCombineNorm& run, Stream stream) { return false; }
};

}  // namespace kiln
