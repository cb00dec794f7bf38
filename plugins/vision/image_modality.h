// The `image` modality: an image part's bytes → decode (PNG, JPEG, WebP) → the glm5_next image processor → the
// vision tower on the CPU → the prompt tokens <|begin_of_image|>, one <|image|> per merged embedding,
// <|end_of_image|>, and the embedding rows for the placeholders.
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "image_processor.h"
#include "kiln/modality.h"
#include "tensor_file.h"
#include "vision_config.h"
#include "vision_weights.h"

namespace kiln::vision {

class ImageModality final : public Modality {
 public:
  // `weights` loaded, or (when the modality is made only to be checked, e.g. by `kiln recipe check`) left empty and
  // read from `tensors` on the first encode.
  ImageModality(VisionConfig config, CheckpointTensors tensors, std::optional<VisionWeights> weights);

  std::vector<std::string> accepted_mime_types() const override;
  Result<MediaEmbedding> encode(const MediaItem& item, Stream stream) override;

  const VisionConfig& config() const { return config_; }
  const ImageProcessorConfig& processor_config() const { return processor_; }

 private:
  VisionConfig config_;
  ImageProcessorConfig processor_;
  CheckpointTensors tensors_;
  std::once_flag load_once_;
  Status load_status_;
  std::optional<VisionWeights> weights_;
};

// The modality for the checkpoint folder `dir` (config.json + safetensors); `load_weights` false reads only the
// safetensors headers (every tower tensor present with its shape) and defers the weights to the first image.
Result<std::unique_ptr<ImageModality>> make_image_modality(const std::string& dir, int64_t text_hidden_size,
                                                           bool load_weights);

}  // namespace kiln::vision
