// The plugin's descriptor and the `image` modality's factory: the checkpoint's vision tower, loaded when the engine
// creates it (a device context is given), checked from the safetensors headers alone otherwise (`kiln recipe check`);
// under model.load = "dummy" (ModelInfo::synthetic_weights) a tower of vision_config's shapes with random weights,
// seeded as the core seeds the model's, so a dummy recipe times the whole image path.
#include "image_modality.h"
#include "kiln/device_context.h"
#include "kiln/plugin.h"

namespace kiln::vision {
namespace {

// A 1024² image is ~1300 tokens: at GLM-5.3-Flash's width (4096) 21 MiB of rows, so 256 MiB keeps about a dozen.
constexpr int64_t kDefaultCacheMib = 256;

Result<std::unique_ptr<Modality>> make_modality(const CreateContext& ctx) {
  if (ctx.model == nullptr || ctx.model->checkpoint_dir.empty())
    return failed_precondition("the `image` modality reads the model's vision tower, and no model folder is known");
  const int64_t cache_mib = ctx.section ? ctx.section->get_int("encode_cache_mib", kDefaultCacheMib) : kDefaultCacheMib;
  // With a device context the weights load now — onto the model's GPU when it runs on one.
  const int cuda_device = ctx.device.is_cuda() && ctx.device_context != nullptr ? ctx.device.index : -1;
  const std::optional<uint64_t> random_seed =
      ctx.model->synthetic_weights ? std::optional<uint64_t>(ctx.model->weight_seed) : std::nullopt;
  auto m = make_image_modality(ctx.model->checkpoint_dir, ctx.model->hidden_size, ctx.device_context != nullptr,
                               cache_mib, cuda_device, random_seed);
  if (!m.ok()) return m.status().with_context("modality `image` (" + ctx.model->checkpoint_dir + ")");
  return std::unique_ptr<Modality>(std::move(m).value());
}

Status register_vision(Registrar& registrar) {
  KeySpec cache;
  cache.name = "encode_cache_mib";
  cache.type = ValueType::kInteger;
  cache.default_value = kDefaultCacheMib;
  cache.min = 0;
  cache.max = 1 << 20;
  cache.doc =
      "MiB of recent images' embeddings kept so a repeated image (same bytes) skips the vision tower (0 = "
      "none)";
#ifdef VISION_WITH_CUDA
  const DeviceSet devices = DeviceSet::cpu_and_cuda();
#else
  const DeviceSet devices = DeviceSet::cpu();
#endif
  return registrar.add<Modality>("image",
                                 "images (PNG, JPEG, WebP) through glm5_next's image processor and vision tower, on "
                                 "the model's device",
                                 &make_modality, devices, SectionSchema{{cache}});
}

}  // namespace
}  // namespace kiln::vision

KILN_PLUGIN("vision", "0.1.0", "images for glm5_next (GLM-5.3-Flash): decoding, processor, vision tower",
            &kiln::vision::register_vision)
