// Where a tensor lives and which stream orders work on it.
#pragma once

#include <string>

namespace kiln {

enum class DeviceType { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device cpu() { return {DeviceType::kCpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::kCuda, i}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool operator==(const Device&) const = default;
  std::string to_string() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

// An opaque stream handle: a cudaStream_t on CUDA devices, unused (nullptr) on the CPU.
// Kept as void* so the SDK does not force CUDA headers on CPU-only plugins.
struct Stream {
  Device device;
  void* handle = nullptr;
};

}  // namespace kiln
