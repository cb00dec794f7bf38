// A host collective (the built-in `socket`) used by a CUDA rank: each call waits for the compute stream, copies its
// operand from the device into pinned host memory, meets the other ranks there, and copies the result back. It lets
// ranks that NCCL cannot serve run tensor parallelism on CUDA — two rank processes sharing one GPU (NCCL refuses two
// ranks on one device), hosts without peer access — which is how the CUDA runner's sharding is tested on one GPU.
// A correctness path for tests and such hosts, not a fast one: every call is a host round trip (stream sync, two
// PCIe copies, TCP through rank 0), and its calls cannot be captured into a CUDA graph, which it says through
// HostMeetingCollective (parallel/collective_capture.h), so the runner replays no graphs with it.
#pragma once

#include <memory>
#include <string>

#include "parallel/collective_capture.h"
#include "runtime/cuda/device_arena.h"

namespace kiln::cuda {

class HostStagedCollective final : public Collective, public HostMeetingCollective {
 public:
  explicit HostStagedCollective(std::unique_ptr<Collective> host) : host_(std::move(host)) {}
  ~HostStagedCollective() override = default;

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  Status all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) override;
  Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) override;
  Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, Stream stream) override;
  Status broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) override;

  std::string why_not_capturable() const override;
  Collective& host_collective() override { return *host_; }

 private:
  // Waits for `stream` (refusing a stream being captured) and copies `bytes` of device `src` into in_.
  Status to_host(const void* src, size_t bytes, const Stream& stream, const char* what);
  // Copies `bytes` of `host` to device `dst` and waits for the copy (the pinned buffers are reused by the next call).
  Status to_device(void* dst, const char* host, size_t bytes, const Stream& stream, const char* what);

  std::unique_ptr<Collective> host_;
  PinnedHostBuffer in_, out_;
};

}  // namespace kiln::cuda
