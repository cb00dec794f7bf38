// Device memory for the CUDA runtime: plain cudaMalloc chunks handed out by bumping a pointer (no managed
// memory, nothing freed piecemeal: weights and KV pages live as long as the model), and a growable scratch
// buffer for one step's activations.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/status.h"

namespace kiln::cuda {

// Device memory that a model's calls outside its steps reuse (a drafter's tensor-parallel embedding and logits):
// grown to the largest request, never freed piecemeal (the device context holds it as long as the model).
class GrowingDeviceBuffer {
 public:
  template <class Context>
  Result<char*> get(Context& dev, size_t bytes, const char* what) {
    if (bytes > bytes_) {
      const size_t want = bytes > 2 * bytes_ ? bytes : 2 * bytes_;
      auto p = dev.allocate(want, what);
      if (!p.ok()) return p.status();
      data_ = static_cast<char*>(*p);
      bytes_ = want;
    }
    return data_;
  }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

class DeviceArena {
 public:
  explicit DeviceArena(size_t chunk_bytes = size_t{1} << 30) : chunk_bytes_(chunk_bytes) {}
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // 256-byte aligned; a request of a quarter chunk or more gets an allocation of its own size.
  Result<void*> allocate(size_t bytes, const char* what);
  template <typename T>
  Result<T*> allocate_array(size_t count, const char* what) {
    KILN_ASSIGN_OR_RETURN(void* p, allocate(count * sizeof(T), what));
    return static_cast<T*>(p);
  }
  size_t bytes_used() const { return used_; }
  size_t bytes_reserved() const { return reserved_; }

 private:
  struct Chunk {
    char* base;
    size_t size, offset;
  };
  size_t chunk_bytes_;
  std::vector<Chunk> chunks_;
  size_t used_ = 0, reserved_ = 0;
};

// One step's activations: carve() lays buffers out from the start each step. With no storage (measure pass)
// it only counts bytes, so a step can size its buffers, ensure() them, then carve again for real.
class StepScratch {
 public:
  ~StepScratch();
  Status ensure(size_t bytes);
  void begin(bool measure) {
    measure_ = measure;
    offset_ = 0;
  }
  template <typename T>
  T* carve(size_t count) {
    const size_t at = offset_;
    offset_ += (count * sizeof(T) + 255) / 256 * 256;
    return measure_ ? nullptr : reinterpret_cast<T*>(base_ + at);
  }
  size_t offset() const { return offset_; }
  const void* base() const { return base_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0, offset_ = 0;
  bool measure_ = true;
};

// Page-locked host memory for a step's uploads: one DMA from it costs a fraction of several pageable copies.
// The caller must not refill it while a copy from it may still be running.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  ~PinnedHostBuffer();
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  Status ensure(size_t bytes);
  char* data() const { return base_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0;
};

// Host-to-device uploads that may run ahead of the stream: each upload packs into the next of a few pinned slots and
// records an event after its DMA; a slot is refilled only once its previous DMA has run. Steps that follow each other
// without a host synchronisation (a drafter's chained next-n steps) thus never overwrite bytes still waiting to be
// copied, and the host stays up to kSlots uploads ahead of the device.
class PinnedUploadRing {
 public:
  static constexpr size_t kSlots = 8;
  PinnedUploadRing() = default;
  ~PinnedUploadRing();
  PinnedUploadRing(const PinnedUploadRing&) = delete;
  PinnedUploadRing& operator=(const PinnedUploadRing&) = delete;
  // A slot of at least `bytes` to pack into, once its last DMA has finished; then submit() the same slot.
  Result<char*> acquire(size_t bytes);
  // Copies the acquired slot's first `bytes` to `device` on `stream` and marks the slot busy until that copy has run.
  Status submit(void* device, size_t bytes, cudaStream_t stream, const char* what);

 private:
  std::array<PinnedHostBuffer, kSlots> slots_;
  std::array<cudaEvent_t, kSlots> done_{};
  std::array<bool, kSlots> pending_{};
  size_t next_ = 0, current_ = kSlots;
};

}  // namespace kiln::cuda
