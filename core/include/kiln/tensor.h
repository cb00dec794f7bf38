// Non-owning tensor views: what crosses the plugin boundary. Storage is owned elsewhere
// (the checkpoint's mmap, a device arena, a KV pool).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/device.h"

namespace kiln {

enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI8, kI16, kI32, kI64, kU8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI8: return 1;
    case DType::kI16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t);

constexpr int kMaxTensorRank = 6;

// A strided view of up to kMaxTensorRank dimensions; strides are in elements.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device;
  int rank = 0;
  std::array<int64_t, kMaxTensorRank> shape{};
  std::array<int64_t, kMaxTensorRank> strides{};

  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> dims,
                               Device device = Device::cpu()) {
    TensorView t;
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.rank = static_cast<int>(dims.size());
    int i = 0;
    for (int64_t d : dims) t.shape[i++] = d;
    int64_t s = 1;
    for (int k = t.rank - 1; k >= 0; --k) {
      t.strides[k] = s;
      s *= t.shape[k];
    }
    return t;
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? rank + i : i]; }
  bool is_contiguous() const {
    int64_t s = 1;
    for (int k = rank - 1; k >= 0; --k) {
      if (shape[k] != 1 && strides[k] != s) return false;
      s *= shape[k];
    }
    return true;
  }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
  std::string shape_string() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

}  // namespace kiln
