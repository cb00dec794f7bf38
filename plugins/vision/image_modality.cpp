#include "image_modality.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

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

Status ImageModality::load_weights_once() {
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
  return load_status_;
}

Result<MediaEmbedding> ImageModality::encode_processed(const std::vector<uint8_t>& bytes,
                                                       const ProcessedImage& processed) {
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
  cache_.insert(bytes, e);
  return e;
}

Result<MediaEmbedding> ImageModality::encode(const MediaItem& item, Stream) {
  KILN_RETURN_IF_ERROR(load_weights_once());
  if (std::optional<MediaEmbedding> seen = cache_.find(item.bytes)) return std::move(*seen);
  KILN_ASSIGN_OR_RETURN(const RgbImage image, decode_image(item.bytes));
  KILN_ASSIGN_OR_RETURN(const ProcessedImage processed, process_image(image, processor_));
  return encode_processed(item.bytes, processed);
}

std::vector<Result<MediaEmbedding>> ImageModality::encode_all(std::span<const MediaItem> items, Stream stream) {
  std::vector<Result<MediaEmbedding>> out;
  out.reserve(items.size());
  if (Status s = load_weights_once(); !s.ok()) {
    for (size_t i = 0; i < items.size(); ++i) out.push_back(s);
    return out;
  }
  if (items.size() <= 1) {
    for (const MediaItem& item : items) out.push_back(encode(item, stream));
    return out;
  }
  // Decoding and the processor are the host's part of an image (≈ 40 ms for a 1024² PNG): a 16-image request spent
  // most of its host time there, one image after another. Workers take the items in order; the tower (one at a
  // time either way) starts on the first as soon as it is ready, so decoding overlaps the tower too. Repeats are
  // answered from the cache before any work.
  struct Slot {
    std::optional<MediaEmbedding> cached;
    std::promise<Result<ProcessedImage>> promise;
    std::future<Result<ProcessedImage>> future;
  };
  std::vector<Slot> slots(items.size());
  std::vector<size_t> work;
  for (size_t i = 0; i < items.size(); ++i) {
    slots[i].cached = cache_.find(items[i].bytes);
    if (!slots[i].cached) {
      slots[i].future = slots[i].promise.get_future();
      work.push_back(i);
    }
  }
  const unsigned hw = host_threads_ ? host_threads_ : std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>(work.size(), hw);
  std::atomic<size_t> next{0};
  std::vector<std::jthread> workers;
  workers.reserve(threads);
  for (size_t t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      for (size_t k; (k = next.fetch_add(1)) < work.size();) {
        const size_t i = work[k];
        Result<ProcessedImage> processed = [&]() -> Result<ProcessedImage> {
          KILN_ASSIGN_OR_RETURN(const RgbImage image, decode_image(items[i].bytes));
          return process_image(image, processor_);
        }();
        slots[i].promise.set_value(std::move(processed));
      }
    });
  for (size_t i = 0; i < items.size(); ++i) {
    if (slots[i].cached) {
      out.push_back(std::move(*slots[i].cached));
      continue;
    }
    Result<ProcessedImage> processed = slots[i].future.get();
    if (!processed.ok()) {
      out.push_back(processed.status());
      continue;
    }
    // The same bytes twice in one request: the first run's rows, from the cache (when it is on).
    if (std::optional<MediaEmbedding> seen = cache_.find(items[i].bytes)) {
      out.push_back(std::move(*seen));
      continue;
    }
    out.push_back(encode_processed(items[i].bytes, *processed));
  }
  return out;  // the workers have set every promise by now; the jthreads join here
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
