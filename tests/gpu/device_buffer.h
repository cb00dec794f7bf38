// Test helpers: device buffers that are poisoned before a kernel runs, bf16 inputs the CPU reference sees exactly,
// and the relative error the tolerances are stated in.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/half_float.h"

namespace kiln::test {

#define KILN_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(cudaGetLastError())
#define KILN_STATUS_OK(expr)                   \
  do {                                         \
    const ::kiln::Status s_ = (expr);          \
    ASSERT_TRUE(s_.ok()) << s_.to_string();    \
  } while (0)

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  // upload() and poison() run on the legacy default stream and may return before they have landed (a pageable
  // cudaMemcpy before its DMA, cudaMemset at all). A non-blocking stream (the device context's, a test's own) does
  // not wait for that stream, so its kernels could read the old bytes or have their output overwritten by the
  // poison: both wait for the device before returning.
  void upload(const std::vector<T>& host) {
    cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  // Every byte 0xff: NaN for fp32 and bf16, −1 for integers.
  void poison() {
    cudaMemset(ptr_, 0xff, n_ * sizeof(T));
    cudaDeviceSynchronize();
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// Random values rounded to bf16: `bits` for the device, `values` (the same numbers as fp32) for the CPU.
struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

inline Bf16Data random_bf16(size_t n, std::mt19937_64& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Bf16Data d{std::vector<uint16_t>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    d.bits[i] = cpu::float_to_bf16(dist(rng));
    d.values[i] = cpu::bf16_to_float(d.bits[i]);
  }
  return d;
}

inline std::vector<float> random_f32(size_t n, std::mt19937_64& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> widen(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = cpu::bf16_to_float(bits[i]);
  return v;
}

// ‖got − want‖ / ‖want‖; NaN anywhere in `got` (an unwritten or broken element) gives +inf.
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace kiln::test
