#include "ipc_all_reduce.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace kiln::nccl::cuda {
namespace {

Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return ok_status();
  return unavailable(what + ": " + cudaGetErrorString(e));
}

}  // namespace

Result<std::unique_ptr<IpcAllReduce>> IpcAllReduce::create(int rank, int world_size, size_t capacity) {
  if (world_size < 1 || world_size > kMaxRanks)
    return unimplemented("the custom all-reduce takes 1.." + std::to_string(kMaxRanks) + " ranks, not " +
                         std::to_string(world_size));
  if (rank < 0 || rank >= world_size) return invalid_argument("custom all-reduce: rank " + std::to_string(rank));
  if (capacity == 0 || capacity % kPackBytes != 0)
    return invalid_argument("custom all-reduce: capacity must be a positive multiple of 16 bytes");
  std::unique_ptr<IpcAllReduce> ar(new IpcAllReduce(rank, world_size, capacity));
  void* base = nullptr;
  // cudaMalloc, not a pool allocation: its pointer is the allocation's base, which is what an IPC handle names.
  KILN_RETURN_IF_ERROR(cuda_status(cudaMalloc(&base, kSignalBytes + capacity), "custom all-reduce: cudaMalloc"));
  ar->own_ = static_cast<char*>(base);
  KILN_RETURN_IF_ERROR(cuda_status(cudaMemset(base, 0, kSignalBytes + capacity), "custom all-reduce: cudaMemset"));
  KILN_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "custom all-reduce: zeroing the signal area"));
  ar->table_.signal[rank] = reinterpret_cast<uint32_t*>(ar->own_);
  ar->table_.data[rank] = ar->own_ + kSignalBytes;
  return ar;
}

IpcAllReduce::~IpcAllReduce() {
  close_peers();
  if (own_) cudaFree(own_);
}

Result<std::string> IpcAllReduce::export_handle() const {
  cudaIpcMemHandle_t h;
  KILN_RETURN_IF_ERROR(cuda_status(cudaIpcGetMemHandle(&h, own_), "cudaIpcGetMemHandle"));
  return std::string(reinterpret_cast<const char*>(&h), sizeof h);
}

Status IpcAllReduce::open_peers(const std::vector<std::string>& handles) {
  if (static_cast<int>(handles.size()) != world_)
    return invalid_argument("custom all-reduce: " + std::to_string(handles.size()) + " handles for " +
                            std::to_string(world_) + " ranks");
  close_peers();
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    cudaIpcMemHandle_t h;
    if (handles[r].size() != sizeof h)
      return invalid_argument("rank " + std::to_string(r) + " sent a " + std::to_string(handles[r].size()) +
                              "-byte IPC handle (expected " + std::to_string(sizeof h) + ")");
    std::memcpy(&h, handles[r].data(), sizeof h);
    void* peer = nullptr;
    // Lazy peer access: enables it where the peer's GPU is another device, and is a no-op on a shared GPU.
    KILN_RETURN_IF_ERROR(cuda_status(cudaIpcOpenMemHandle(&peer, h, cudaIpcMemLazyEnablePeerAccess),
                                     "opening rank " + std::to_string(r) + "'s CUDA IPC handle"));
    opened_.push_back(static_cast<char*>(peer));
    table_.signal[r] = static_cast<uint32_t*>(peer);
    table_.data[r] = static_cast<char*>(peer) + kSignalBytes;
  }
  peers_open_ = true;
  return ok_status();
}

void IpcAllReduce::close_peers() {
  for (char* p : opened_) cudaIpcCloseMemHandle(p);
  opened_.clear();
  for (int r = 0; r < world_; ++r)
    if (r != rank_) table_.signal[r] = nullptr, table_.data[r] = nullptr;
  peers_open_ = false;
}

bool IpcAllReduce::takes(const void* buffer, int64_t count, DType dtype, ReduceOp op) const {
  if (!peers_open_ || op != ReduceOp::kSum || (dtype != DType::kF32 && dtype != DType::kBF16) || count <= 0)
    return false;
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  return bytes % kPackBytes == 0 && bytes <= capacity_ && reinterpret_cast<uintptr_t>(buffer) % kPackBytes == 0;
}

IpcAllReduce::Algorithm IpcAllReduce::choose(size_t bytes, int world_size) {
  return world_size > 2 && bytes >= kTwoShotFromBytes ? Algorithm::kTwoShot : Algorithm::kOneShot;
}

Status IpcAllReduce::all_reduce(void* buffer, int64_t count, DType dtype, cudaStream_t stream, Algorithm algorithm,
                                uint64_t timeout_ns, uint32_t* timed_out) {
  if (!takes(buffer, count, dtype, ReduceOp::kSum))
    return invalid_argument("custom all-reduce: " + std::to_string(count) + " " + dtype_name(dtype) +
                            " elements at this address are not taken (sum of bf16/fp32, 16-byte aligned, multiple "
                            "of 16 bytes, at most " +
                            std::to_string(capacity_) + " bytes, peers opened)");
  if (timeout_ns != 0 && !timed_out) return invalid_argument("custom all-reduce: a timeout needs a flag to set");
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  if (algorithm == Algorithm::kAuto) algorithm = choose(bytes, world_);
  KILN_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(table_.data[rank_], buffer, bytes, cudaMemcpyDeviceToDevice, stream),
                                   "custom all-reduce: copy in"));
  return cuda_status(
      launch_ipc_all_reduce(table_, rank_, world_, dtype == DType::kF32 ? ElementType::kF32 : ElementType::kBF16,
                            algorithm == Algorithm::kTwoShot, static_cast<int64_t>(bytes / kPackBytes), buffer,
                            timeout_ns, timed_out, stream),
      "custom all-reduce: launch");
}

namespace {
size_t moe_rows_bytes(const MoeCombineNorm& run) {
  return static_cast<size_t>((run.n * run.top_k + (run.shared ? run.n : 0)) * run.hidden) * sizeof(float);
}
}  // namespace

bool IpcAllReduce::takes(const MoeCombineNorm& run) const {
  if (!peers_open_ || run.n <= 0 || run.top_k <= 0 || run.hidden <= 0 || !run.y || !run.residual ||
      !run.norm_weight || !run.normed)
    return false;
  // One block per token (decode-sized steps; a prefill chunk's sum is a bandwidth job the all-reduce kernel does
  // better), each factor bounded before the product.
  if (run.n > kMaxBlocks || run.hidden > int64_t{1} << 24 || run.top_k > 1024 || run.hidden % 4 != 0) return false;
  return moe_combine_norm_shared_bytes(run.top_k, run.hidden, run.shared) <= kMoeCombineNormMaxSharedBytes &&
         moe_rows_bytes(run) <= capacity_;
}

Status IpcAllReduce::moe_combine_norm(const MoeCombineNorm& run, cudaStream_t stream) {
  if (!takes(run))
    return invalid_argument("custom all-reduce: the fused MoE sum takes " + std::to_string(run.n) + " tokens of " +
                            std::to_string(run.top_k) + " slots × " + std::to_string(run.hidden) +
                            " only with peers opened, up to " + std::to_string(kMaxBlocks) +
                            " tokens, a token's rows within " + std::to_string(kMoeCombineNormMaxSharedBytes) +
                            " bytes of shared memory and the step's within " + std::to_string(capacity_));
  KILN_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(table_.data[rank_], run.y, moe_rows_bytes(run), cudaMemcpyDeviceToDevice, stream),
      "custom all-reduce: copy in (fused MoE sum)"));
  const MoeCombineNormArgs c{run.n, run.top_k, run.hidden, run.shared, run.residual, run.norm_weight, run.eps,
                             run.normed};
  return cuda_status(launch_ipc_moe_combine_norm(table_, rank_, world_, c, stream),
                     "custom all-reduce: launch (fused MoE sum + combine + RMSNorm)");
}

}  // namespace kiln::nccl::cuda
