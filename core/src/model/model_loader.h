// Builds a runnable model from a recipe: config.json, the checkpoint, and the weight format and KV layout
// the recipe selects (created through the registry, so plugins and built-ins are treated alike).
#pragma once

#include <memory>

#include "kiln/kv_layout.h"
#include "kiln/weight_format.h"
#include "model/checkpoint.h"
#include "model/mla_moe_model.h"
#include "recipe/recipe.h"

namespace kiln {

namespace cuda {
class CudaMlaMoeModel;
}

struct LoadedModel {
  // Declaration order is destruction order reversed: the model's layers (plugin code, views into the
  // checkpoint's mapping) go first, then the plugins' objects, then the mapping.
  std::unique_ptr<Checkpoint> checkpoint;
  std::shared_ptr<WeightFormat> format;
  std::shared_ptr<KvLayout> layout;
  ModelInfo info;
  // With model.load = "dummy" its weights are empty: only config() is usable, and forward() refuses.
  std::unique_ptr<MlaMoeModel> model;
  // Set when the recipe runs the model on a CUDA device (model.device = "cuda", or "auto" with a GPU present):
  // the engine then drives this model's runner instead of the CPU one.
  std::shared_ptr<cuda::CudaMlaMoeModel> gpu;
};

struct ModelLoadOptions {
  bool load_mtp = false;  // also load the checkpoint's next-n (MTP) layers
};

Result<LoadedModel> load_model(const Recipe& recipe, const Registry& registry, const ModelLoadOptions& options = {});

// A KV pool for `tokens` tokens (rounded up to whole blocks) for this model.
std::unique_ptr<KvCache> make_kv_cache(const LoadedModel& m, int64_t tokens);

}  // namespace kiln
