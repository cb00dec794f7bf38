// Where a tensor lives, which stream orders work on it, and which devices an implementation runs on.
#pragma once

#include <cstdint>
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

// The device types an implementation runs on, declared when it registers (`kiln plugins -v` lists them, and
// `kiln recipe check` refuses a recipe that selects it for a device it does not implement).
struct DeviceSet {
  uint32_t bits = 0;

  static constexpr DeviceSet cpu() { return {1u << static_cast<int>(DeviceType::kCpu)}; }
  static constexpr DeviceSet cuda() { return {1u << static_cast<int>(DeviceType::kCuda)}; }
  static constexpr DeviceSet cpu_and_cuda() { return {cpu().bits | cuda().bits}; }
  constexpr bool contains(DeviceType t) const { return (bits >> static_cast<int>(t)) & 1u; }
  constexpr bool empty() const { return bits == 0; }
  constexpr DeviceSet operator|(DeviceSet o) const { return {bits | o.bits}; }
  bool operator==(const DeviceSet&) const = default;
  // "cpu, cuda"
  std::string to_string() const {
    std::string s;
    if (contains(DeviceType::kCpu)) s += "cpu";
    if (contains(DeviceType::kCuda)) s += s.empty() ? "cuda" : ", cuda";
    return s.empty() ? "none" : s;
  }
};

inline const char* device_type_name(DeviceType t) { return t == DeviceType::kCpu ? "cpu" : "cuda"; }

}  // namespace kiln
