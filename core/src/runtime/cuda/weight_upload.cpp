#include "runtime/cuda/weight_upload.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/half_float.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {
constexpr float kDummyStd = 0.02f;
}  // namespace

uint64_t WeightUploader::seed_for(const std::string& name) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: a stable per-name stream
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return src_.seed() * 0x9E3779B97F4A7C15ull ^ h;
}

Result<TensorView> WeightUploader::checked(const std::string& name, int64_t rows, int64_t cols) const {
  KILN_ASSIGN_OR_RETURN(TensorView t, src_.get(name));
  const bool ok = (t.rank == 2 && t.shape[0] == rows && t.shape[1] == cols) || (t.rank == 1 && rows == 1 && t.shape[0] == cols);
  if (!ok)
    return invalid_argument("tensor `" + name + "` has shape " + t.shape_string() + ", the config implies [" +
                            std::to_string(rows) + ", " + std::to_string(cols) + "]");
  return t;
}

Status WeightUploader::copy(void* dst, const void* src, size_t bytes, const std::string& name) {
  // On the model's stream, and waited for there: the host staging buffer is reused for the next tensor, and kernels
  // queued on that stream while loading (W_UK's transpose reads kv_b) and every step after it must see the bytes.
  // A plain cudaMemcpy runs on the legacy default stream, which the model's non-blocking stream does not wait for,
  // and from pageable memory it may return before its DMA has landed (CUDA's API synchronisation notes).
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) return internal_error("uploading `" + name + "`: " + cudaGetErrorString(e));
  return ok_status();
}

Status WeightUploader::bf16(const std::string& name, int64_t rows, int64_t cols, uint16_t* dst, DummyInit init) {
  const size_t n = static_cast<size_t>(rows * cols);
  if (src_.synthetic()) {
    if (init == DummyInit::kRandom) return fill_uniform_bf16(dst, n, kDummyStd * std::sqrt(3.0f), seed_for(name), stream_);
    return fill_constant_bf16(dst, n, init == DummyInit::kOne ? 1.0f : 0.0f, stream_);
  }
  KILN_ASSIGN_OR_RETURN(TensorView t, checked(name, rows, cols));
  host_.resize(n);
  switch (t.dtype) {
    case DType::kBF16: std::copy_n(t.as<const uint16_t>(), n, host_.begin()); break;
    case DType::kF32: cpu::float_to_bf16(t.as<const float>(), host_.data(), static_cast<int64_t>(n)); break;
    case DType::kF16: {
      std::vector<float> f(n);
      cpu::fp16_to_float(t.as<const uint16_t>(), f.data(), static_cast<int64_t>(n));
      cpu::float_to_bf16(f.data(), host_.data(), static_cast<int64_t>(n));
      break;
    }
    default: return invalid_argument("tensor `" + name + "` has dtype " + dtype_name(t.dtype) + "; expected F32, BF16 or F16");
  }
  return copy(dst, host_.data(), n * sizeof(uint16_t), name);
}

Status WeightUploader::f32(const std::string& name, int64_t rows, int64_t cols, float* dst, DummyInit init) {
  const size_t n = static_cast<size_t>(rows * cols);
  if (src_.synthetic()) {
    if (init == DummyInit::kRandom) return fill_uniform_f32(dst, n, kDummyStd * std::sqrt(3.0f), seed_for(name), stream_);
    return fill_constant_f32(dst, n, init == DummyInit::kOne ? 1.0f : 0.0f, stream_);
  }
  if (init == DummyInit::kZero && !src_.has(name)) return fill_constant_f32(dst, n, 0.0f, stream_);
  KILN_ASSIGN_OR_RETURN(TensorView t, checked(name, rows, cols));
  std::vector<float> f(n);
  switch (t.dtype) {
    case DType::kF32: std::copy_n(t.as<const float>(), n, f.begin()); break;
    case DType::kBF16: cpu::bf16_to_float(t.as<const uint16_t>(), f.data(), static_cast<int64_t>(n)); break;
    case DType::kF16: cpu::fp16_to_float(t.as<const uint16_t>(), f.data(), static_cast<int64_t>(n)); break;
    default: return invalid_argument("tensor `" + name + "` has dtype " + dtype_name(t.dtype) + "; expected F32, BF16 or F16");
  }
  return copy(dst, f.data(), n * sizeof(float), name);
}

Status WeightUploader::finish() {
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) return internal_error(std::string("weight upload: ") + cudaGetErrorString(e));
  return ok_status();
}

}  // namespace kiln::cuda
