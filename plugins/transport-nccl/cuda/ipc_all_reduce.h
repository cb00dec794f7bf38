// The custom all-reduce's host side: this rank's staging buffer + signal area (one cudaMalloc, exported as a CUDA
// IPC handle), the peers' opened handles, and the call that copies the input into staging and launches the kernel.
// Both steps are stream-ordered and allocation-free, so a call is capturable in a CUDA graph; the kernel reads its
// epoch from device memory, so replays stay in step with the peers.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "ipc_all_reduce_kernels.h"
#include "kiln/collective.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln::nccl::cuda {

class IpcAllReduce {
 public:
  enum class Algorithm { kAuto, kOneShot, kTwoShot };
  static constexpr size_t kDefaultCapacity = size_t{8} << 20;
  // Above this many bytes (and with more than two ranks) two-shot moves less data than one-shot; at two ranks both
  // read one peer's buffer once, so one-shot, with one barrier fewer, always wins.
  static constexpr size_t kTwoShotFromBytes = size_t{512} << 10;

  // Allocates and zeroes this rank's area on the current device.
  static Result<std::unique_ptr<IpcAllReduce>> create(int rank, int world_size, size_t capacity = kDefaultCapacity);
  // Closes the peers' handles and frees this rank's area: every peer must have closed its handle to this rank's
  // area first (the owner of the object runs a barrier between close_peers() and destruction).
  ~IpcAllReduce();
  IpcAllReduce(const IpcAllReduce&) = delete;
  IpcAllReduce& operator=(const IpcAllReduce&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  size_t capacity() const { return capacity_; }

  // This rank's cudaIpcMemHandle_t, to send to the peers.
  Result<std::string> export_handle() const;
  // Opens every other rank's handle (handles[r] from rank r; this rank's own entry is ignored).
  Status open_peers(const std::vector<std::string>& handles);
  void close_peers();

  // Whether the custom kernel takes this call: a sum over bf16 or fp32, a 16-byte aligned buffer, a size that is a
  // multiple of 16 bytes and fits the staging buffer. The rest goes to NCCL.
  bool takes(const void* buffer, int64_t count, DType dtype, ReduceOp op) const;
  static Algorithm choose(size_t bytes, int world_size);

  // Whether moe_combine_norm takes this call: peers opened, at least one token, the rows fit the staging buffer.
  bool takes(const MoeCombineNorm& run) const;
  // The ranks' sum of run.y with the combine, residual add and RMSNorm after it, in one launch (see
  // kiln::Collective::all_reduce_moe_combine_norm): the rows are copied into staging, then the fused kernel runs.
  Status moe_combine_norm(const MoeCombineNorm& run, cudaStream_t stream);

  // In place over `count` elements of `buffer`. timeout_ns / timed_out: see launch_ipc_all_reduce (the probe).
  Status all_reduce(void* buffer, int64_t count, DType dtype, cudaStream_t stream,
                    Algorithm algorithm = Algorithm::kAuto, uint64_t timeout_ns = 0, uint32_t* timed_out = nullptr);

 private:
  IpcAllReduce(int rank, int world, size_t capacity) : rank_(rank), world_(world), capacity_(capacity) {}

  int rank_, world_;
  size_t capacity_;
  char* own_ = nullptr;        // [signal area | staging buffer]
  std::vector<char*> opened_;  // peers' areas this process opened
  PeerTable table_{};
  bool peers_open_ = false;
};

}  // namespace kiln::nccl::cuda
