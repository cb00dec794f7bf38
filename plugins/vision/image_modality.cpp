#include "image_modality.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "image_decode.h"
#include "processor_settings.h"
#include "vision_tower.h"
#ifdef VISION_WITH_CUDA
#include "cuda/vision_tower_cuda.h"
#endif

namespace kiln::vision {

ImageModality::ImageModality(VisionConfig config, ImageProcessorConfig processor, CheckpointTensors tensors,
                             std::optional<VisionWeights> weights, uint64_t cache_bytes,
                             std::optional<uint64_t> random_seed)
    : config_(std::move(config)),
      processor_(processor),
      tensors_(std::move(tensors)),
      random_seed_(random_seed),
      weights_(std::move(weights)),
      cache_(cache_bytes) {}

std::vector<std::string> ImageModality::accepted_mime_types() const {
  return {"image/png", "image/jpeg", "image/webp"};
}

Result<MediaEmbedding> ImageModality::encode(const MediaItem& item, Stream) {
  std::call_once(load_once_, [&] {
    if (weights_ || device_tower_) return;
    if (random_seed_) {
      weights_ = random_vision_weights(config_, *random_seed_);
      return;
    }
    auto w = load_vision_weights(tensors_, config_);
    if (w.ok())
      weights_ = std::move(w).value();
    else
      load_status_ = w.status();
  });
  KILN_RETURN_IF_ERROR(load_status_);
  if (std::optional<MediaEmbedding> seen = cache_.find(item.bytes)) return std::move(*seen);
  KILN_ASSIGN_OR_RETURN(const RgbImage image, decode_image(item.bytes));
  KILN_ASSIGN_OR_RETURN(const ProcessedImage processed, process_image(image, processor_));
  const std::array<std::array<int64_t, 3>, 1> grid = {processed.grid_thw};
  KILN_ASSIGN_OR_RETURN(std::vector<float> rows,
                        device_tower_ ? device_tower_(processed.pixel_values, grid)
                                      : run_vision_tower(config_, *weights_, processed.pixel_values, grid));
  MediaEmbedding e;
  e.num_embeddings = processed.num_tokens(processor_);
  e.first_placeholder = 1;
  e.tokens.reserve(static_cast<size_t>(e.num_embeddings + 2));
  e.tokens.push_back(config_.image_start_token_id);
  e.tokens.insert(e.tokens.end(), static_cast<size_t>(e.num_embeddings), config_.image_token_id);
  e.tokens.push_back(config_.image_end_token_id);
  e.embeddings = std::move(rows);
  ++tower_runs_;
  cache_.insert(item.bytes, e);
  return e;
}

Result<std::unique_ptr<ImageModality>> make_image_modality(const std::string& dir, int64_t text_hidden_size,
                                                           bool load_weights, int64_t cache_mib, int cuda_device,
                                                           std::optional<uint64_t> random_seed) {
  const std::filesystem::path config_path = std::filesystem::path(dir) / "config.json";
  std::ifstream in(config_path);
  if (!in) return not_found(config_path.string() + " cannot be read");
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  if (json.is_discarded()) return invalid_argument(config_path.string() + " is not valid JSON");
  KILN_ASSIGN_OR_RETURN(VisionConfig config, parse_vision_config(json));
  if (config.out_hidden_size != text_hidden_size)
    return invalid_argument("vision_config.out_hidden_size " + std::to_string(config.out_hidden_size) +
                            " differs from the text model's hidden_size " + std::to_string(text_hidden_size) +
                            ": the merged image embeddings could not stand in for token embeddings");
  KILN_ASSIGN_OR_RETURN(const ImageProcessorConfig processor, processor_settings(dir, config));
  CheckpointTensors tensors;  // none under model.load = "dummy": the folder may hold no safetensors at all
  if (!random_seed) {
    KILN_ASSIGN_OR_RETURN(tensors, CheckpointTensors::open(dir));
    KILN_RETURN_IF_ERROR(check_vision_weights(tensors, config));
  }
  std::optional<VisionWeights> weights;
  if (load_weights && random_seed) {
    weights = random_vision_weights(config, *random_seed);
  } else if (load_weights) {
    KILN_ASSIGN_OR_RETURN(VisionWeights w, load_vision_weights(tensors, config));
    weights = std::move(w);
  }
  ImageModality::DeviceTower device_tower;
  if (cuda_device >= 0 && weights) {
#ifdef VISION_WITH_CUDA
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<CudaVisionTower> tower, CudaVisionTower::create(config, *weights, cuda_device));
    std::shared_ptr<CudaVisionTower> shared(std::move(tower));
    device_tower = [shared](std::span<const float> pixels, std::span<const std::array<int64_t, 3>> grids) {
      return shared->run(pixels, grids);
    };
    weights.reset();  // on the device now
#else
    return unimplemented("the `image` modality was built without CUDA: its tower runs on the CPU only");
#endif
  }
  auto modality = std::make_unique<ImageModality>(std::move(config), processor, std::move(tensors), std::move(weights),
                                                  static_cast<uint64_t>(std::max<int64_t>(cache_mib, 0)) << 20,
                                                  random_seed);
  if (device_tower) modality->set_device_tower(std::move(device_tower));
  return modality;
}

}  // namespace kiln::vision
