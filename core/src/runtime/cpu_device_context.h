// The DeviceContext of the CPU: heap memory (kept until the context goes), copies with memcpy, no stream.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kiln/device_context.h"

namespace kiln {

class CpuDeviceContext final : public DeviceContext {
 public:
  CpuDeviceContext() = default;
  CpuDeviceContext(const CpuDeviceContext&) = delete;
  CpuDeviceContext& operator=(const CpuDeviceContext&) = delete;

  Device device() const override { return Device::cpu(); }
  Stream stream() const override { return {}; }
  Result<void*> allocate(size_t bytes, const char* what) override;
  int multiprocessor_count() const override { return 0; }
  Status copy(void* dst, const void* src, size_t bytes, bool wait) override;
  Status synchronize() override { return ok_status(); }

  size_t bytes_allocated() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::vector<std::unique_ptr<void, Free>> blocks_;
  size_t bytes_ = 0;
};

}  // namespace kiln
