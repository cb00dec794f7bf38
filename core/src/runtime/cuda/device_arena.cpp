#include "runtime/cuda/device_arena.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

namespace kiln::cuda {
namespace {
constexpr size_t kAlign = 256;

Status cuda_alloc_status(cudaError_t e, size_t bytes, const char* what) {
  if (e == cudaSuccess) return ok_status();
  size_t free_b = 0, total_b = 0;
  cudaGetLastError();
  cudaMemGetInfo(&free_b, &total_b);
  return resource_exhausted(std::string("cudaMalloc of ") + std::to_string(bytes >> 20) + " MiB for " + what + ": " +
                            cudaGetErrorString(e) + " (" + std::to_string(free_b >> 20) + " MiB free of " +
                            std::to_string(total_b >> 20) + ")");
}
}  // namespace

DeviceArena::~DeviceArena() {
  for (Chunk& c : chunks_) cudaFree(c.base);
}

Result<void*> DeviceArena::allocate(size_t bytes, const char* what) {
  bytes = std::max<size_t>((bytes + kAlign - 1) / kAlign * kAlign, kAlign);
  // A large request gets an allocation of its own size: carved from a chunk it would strand the chunk's tail once
  // the next large one no longer fits (GLM-4.7-Flash's 805 + 403 MB expert stacks per layer left ~15 GiB of 1 GiB
  // chunks unused). Chunks then hold only the small tensors, which fill their tails.
  if (bytes >= chunk_bytes_ / 4) {
    void* base = nullptr;
    KILN_RETURN_IF_ERROR(cuda_alloc_status(cudaMalloc(&base, bytes), bytes, what));
    chunks_.push_back({static_cast<char*>(base), bytes, bytes});
    used_ += bytes;
    reserved_ += bytes;
    return base;
  }
  for (Chunk& c : chunks_)
    if (c.size - c.offset >= bytes) {
      void* p = c.base + c.offset;
      c.offset += bytes;
      used_ += bytes;
      return p;
    }
  const size_t size = std::max(bytes, chunk_bytes_);
  void* base = nullptr;
  KILN_RETURN_IF_ERROR(cuda_alloc_status(cudaMalloc(&base, size), size, what));
  chunks_.push_back({static_cast<char*>(base), size, bytes});
  used_ += bytes;
  reserved_ += size;
  return base;
}

StepScratch::~StepScratch() {
  if (base_) cudaFree(base_);
}

Status StepScratch::ensure(size_t bytes) {
  if (bytes <= capacity_) return ok_status();
  if (base_) cudaFree(base_);
  base_ = nullptr;
  capacity_ = 0;
  const size_t want = bytes + bytes / 4;  // headroom so slowly growing contexts do not reallocate every step
  void* p = nullptr;
  KILN_RETURN_IF_ERROR(cuda_alloc_status(cudaMalloc(&p, want), want, "step activations"));
  base_ = static_cast<char*>(p);
  capacity_ = want;
  return ok_status();
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (base_) cudaFreeHost(base_);
}

Status PinnedHostBuffer::ensure(size_t bytes) {
  if (bytes <= capacity_) return ok_status();
  if (base_) cudaFreeHost(base_);
  base_ = nullptr;
  capacity_ = 0;
  const size_t want = bytes + bytes / 4;
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, want, cudaHostAllocDefault);
  if (e != cudaSuccess) return resource_exhausted(std::string("cudaHostAlloc of ") + std::to_string(want) +
                                                  " bytes for the step uploads: " + cudaGetErrorString(e));
  base_ = static_cast<char*>(p);
  capacity_ = want;
  return ok_status();
}

PinnedUploadRing::~PinnedUploadRing() {
  for (size_t i = 0; i < kSlots; ++i) {
    // A slot's memory must not be freed under a DMA still reading it.
    if (pending_[i]) cudaEventSynchronize(done_[i]);
    if (done_[i]) cudaEventDestroy(done_[i]);
  }
}

Result<char*> PinnedUploadRing::acquire(size_t bytes) {
  const size_t i = next_;
  if (!done_[i]) {
    const cudaError_t e = cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming);
    if (e != cudaSuccess) return internal_error(std::string("cudaEventCreate for the step uploads: ") + cudaGetErrorString(e));
  }
  if (pending_[i]) {
    const cudaError_t e = cudaEventSynchronize(done_[i]);
    if (e != cudaSuccess) return internal_error(std::string("waiting for an earlier step upload: ") + cudaGetErrorString(e));
    pending_[i] = false;
  }
  KILN_RETURN_IF_ERROR(slots_[i].ensure(bytes));
  current_ = i;
  return slots_[i].data();
}

Status PinnedUploadRing::submit(void* device, size_t bytes, cudaStream_t stream, const char* what) {
  if (current_ >= kSlots) return failed_precondition(std::string(what) + ": upload submitted without a slot");
  const size_t i = current_;
  current_ = kSlots;
  next_ = (i + 1) % kSlots;
  cudaError_t e = cudaMemcpyAsync(device, slots_[i].data(), bytes, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaEventRecord(done_[i], stream);
  if (e != cudaSuccess) return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
  pending_[i] = true;
  return ok_status();
}

}  // namespace kiln::cuda
