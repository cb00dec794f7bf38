// The `image` modality: an image part's bytes → decode (PNG, JPEG, WebP) → the glm5_next image processor → the
// vision tower (on the CPU, or on the model's GPU) → the prompt tokens <|begin_of_image|>, one <|image|> per merged embedding,
// <|end_of_image|>, and the embedding rows for the placeholders.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <mutex>
#include <optional>

#include "encode_cache.h"
#include "image_processor.h"
#include "kiln/modality.h"
#include "tensor_file.h"
#include "vision_config.h"
#include "vision_weights.h"

namespace kiln::vision {

class ImageModality final : public Modality {
 public:
  // `weights` loaded, or (when the modality is made only to be checked, e.g. by `kiln recipe check`) left empty and
  // read from `tensors` on the first encode — or made randomly from `random_seed` when it is set (model.load =
  // "dummy": `tensors` is empty then).
  ImageModality(VisionConfig config, ImageProcessorConfig processor, CheckpointTensors tensors,
                std::optional<VisionWeights> weights, uint64_t cache_bytes,
                std::optional<uint64_t> random_seed = std::nullopt);

  std::vector<std::string> accepted_mime_types() const override;
  Result<MediaEmbedding> encode(const MediaItem& item, Stream stream) override;
  // Decodes and preprocesses the items on up to `host_threads` threads at once while the tower takes them one by one
  // as they are ready (one image per tower run, so an image's rows do not depend on the request's other images).
  std::vector<Result<MediaEmbedding>> encode_all(std::span<const MediaItem> items, Stream stream) override;
  void set_host_threads(unsigned threads) { host_threads_ = threads; }

  const VisionConfig& config() const { return config_; }
  const ImageProcessorConfig& processor_config() const { return processor_; }
  // The tower on a device (CudaVisionTower) instead of the host's: pixel_values and grids in, rows out.
  using DeviceTower = std::function<Result<std::vector<float>>(std::span<const float>,
                                                               std::span<const std::array<int64_t, 3>>)>;
  void set_device_tower(DeviceTower tower) { device_tower_ = std::move(tower); }
  bool on_device() const { return static_cast<bool>(device_tower_); }
  // Images that went through the tower, and repeats answered from the encode cache.
  uint64_t tower_runs() const { return tower_runs_; }
  uint64_t cache_hits() const { return cache_.hits(); }

 private:
  VisionConfig config_;
  ImageProcessorConfig processor_;
  CheckpointTensors tensors_;
  std::optional<uint64_t> random_seed_;
  std::once_flag load_once_;
  Status load_status_;
  std::optional<VisionWeights> weights_;
  DeviceTower device_tower_;
  EncodeCache cache_;
  std::atomic<uint64_t> tower_runs_{0};
  unsigned host_threads_ = 0;  // 0: the machine's hardware threads

  Status load_weights_once();
  // The tower over one processed image and the embedding the prompt takes (cached under `bytes`).
  Result<MediaEmbedding> encode_processed(const std::vector<uint8_t>& bytes, const ProcessedImage& processed);
};

// The modality for the checkpoint folder `dir` (config.json + safetensors); `load_weights` false reads only the
// safetensors headers (every tower tensor present with its shape) and defers the weights to the first image.
// `cache_mib`: MiB of recent encodings kept for repeated images (0 = none). `cuda_device` ≥ 0 (with load_weights):
// the tower runs there (a build with CUDA; the host keeps no copy of the weights). `random_seed` set (model.load =
// "dummy"): the tower's weights are random_vision_weights(vision_config, seed) and no safetensors are read, so `dir`
// needs only config.json (and preprocessor_config.json, if the processor's defaults are not wanted).
Result<std::unique_ptr<ImageModality>> make_image_modality(const std::string& dir, int64_t text_hidden_size,
                                                           bool load_weights, int64_t cache_mib = 0,
                                                           int cuda_device = -1,
                                                           std::optional<uint64_t> random_seed = std::nullopt);

}  // namespace kiln::vision
