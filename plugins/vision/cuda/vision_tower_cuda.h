// glm5_next's vision tower on a CUDA device: the CPU tower's steps (vision_tower.h) with every linear through cuBLAS
// on the tensor cores — TF32 (the default) or plain fp32 (kFp32, what the tests compare with the CPU at 1e-5).
// Attention within each frame: in the TF32 tower a flash kernel (bf16 tensor cores, vision_flash_attention.h) where
// the head width is 16/32/64/128; otherwise two batched cuBLAS products around a row softmax, the queries in chunks
// so the score matrix stays under a fixed size whatever the image. Weights are uploaded once (fp32); buffers grow to the
// largest image seen and are reused. Its own stream and cuBLAS handle: images are encoded on server threads while
// the engine's thread runs (and captures graphs on) the model's stream. One image at a time (a mutex).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kiln/status.h"
#include "vision_config.h"
#include "vision_weights.h"

namespace kiln::vision {

class CudaVisionTower {
 public:
  enum class Math { kTf32, kFp32 };
  // `score_bytes`: the most one chunk of attention scores may take (its queries shrink to fit; tests force chunks).
  static Result<std::unique_ptr<CudaVisionTower>> create(const VisionConfig& config, const VisionWeights& weights,
                                                         int device, Math math = Math::kTf32,
                                                         size_t score_bytes = size_t{256} << 20);
  ~CudaVisionTower();
  CudaVisionTower(const CudaVisionTower&) = delete;
  CudaVisionTower& operator=(const CudaVisionTower&) = delete;

  // As run_vision_tower: [Σ t·h·w / merge², out_hidden] on the host.
  Result<std::vector<float>> run(std::span<const float> pixel_values, std::span<const std::array<int64_t, 3>> grids);
  // Bytes of device memory the weights take.
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Impl;
  explicit CudaVisionTower(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  size_t weight_bytes_ = 0;
  std::mutex mu_;
};

}  // namespace kiln::vision
