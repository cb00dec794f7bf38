// What the core lends a component that lives on a device (a weight format's linears, a KV layout's workspace, a
// drafter's own weights and caches): memory the core accounts for, the compute stream every step is ordered on,
// and copies. Plugins with no CUDA code of their own can still move data with it.
#pragma once

#include <cstddef>

#include "kiln/device.h"
#include "kiln/status.h"

namespace kiln {

class DeviceContext {
 public:
  virtual ~DeviceContext() = default;
  virtual Device device() const = 0;
  // The compute stream: a component's launches go here, in the order the core calls it.
  virtual Stream stream() const = 0;
  // Memory that lives as long as the model does (weights, caches, persistent buffers), 256-byte aligned and
  // counted in the capacity report under `what`. Freed when the model is. Host memory on the CPU.
  virtual Result<void*> allocate(size_t bytes, const char* what) = 0;
  // Streaming multiprocessors (sizes grids); 0 on the CPU.
  virtual int multiprocessor_count() const = 0;
  // Copies `bytes` between any two of host and this device's memory, ordered on the stream; `wait` blocks until
  // it is done (without it, host sources must stay valid until the stream reaches the copy).
  virtual Status copy(void* dst, const void* src, size_t bytes, bool wait) = 0;
  // Blocks until everything enqueued on the stream so far has run.
  virtual Status synchronize() = 0;
};

}  // namespace kiln
