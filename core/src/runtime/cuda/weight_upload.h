// Checkpoint tensors into device memory: converted to bf16 / fp32 on the host and copied, or — for a synthetic
// source (model.load = "dummy") — generated on the device, random per tensor name from the source's seed (the
// same name and seed give the same values) or constant for norms and biases.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/weight_format.h"
#include "kernels/cuda/stream_handle.h"

namespace kiln::cuda {

// How a synthetic tensor is filled: random with std 0.02 (HF's initializer_range), ones (norm weights), zeros.
enum class DummyInit { kRandom, kOne, kZero };

class WeightUploader {
 public:
  WeightUploader(const WeightSource& source, StreamHandle stream) : src_(source), stream_(stream) {}

  // dst bf16 [rows, cols] (a 1-D tensor of `cols` values when rows == 1) from tensor `name`.
  Status bf16(const std::string& name, int64_t rows, int64_t cols, uint16_t* dst, DummyInit init = DummyInit::kRandom);
  Status f32(const std::string& name, int64_t rows, int64_t cols, float* dst, DummyInit init);
  bool has(const std::string& name) const { return src_.has(name); }
  bool synthetic() const { return src_.synthetic(); }
  // Waits for every copy and fill issued so far.
  Status finish();

 private:
  Result<TensorView> checked(const std::string& name, int64_t rows, int64_t cols) const;
  uint64_t seed_for(const std::string& name) const;
  Status copy(void* dst, const void* src, size_t bytes, const std::string& name);
  const WeightSource& src_;
  StreamHandle stream_;
  std::vector<uint16_t> host_;
};

}  // namespace kiln::cuda
