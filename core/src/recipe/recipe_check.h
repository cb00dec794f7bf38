// `kiln recipe check`: everything that can be known about a recipe before its model is loaded, every problem
// reported (not just the first), each naming the key and the file:line its value came from.
//
// Beyond the schema (read_recipe: unknown keys, types, ranges, finite numbers, missing plugins, settings whose feature
// does not exist yet) it checks, loading no weights and touching no device memory:
//   - model.path is a directory holding a config.json whose model_type the architecture registry knows (the config
//     is parsed), and the checkpoint files model.load = "mmap" reads; speculative.draft_model, when set, exists;
//   - the device: model.device = "cuda" needs a CUDA build, a visible GPU and an architecture that runs there;
//     "auto" resolves as load_model would (resolve_device);
//   - every selected capability (weights.format, kv.layout, speculative.method, transport.backend, media.modality)
//     implements that device;
//   - the KV layout is created for the model's dimensions (its geometry must fit kv_lora_rank / qk_rope_head_dim);
//   - the modality is created, and media.video = true needs one that accepts video;
//   - the drafter is created over services that answer the model's dimensions from its config and run nothing, so its
//     own factory judges the checkpoint (mtp: num_nextn_predict_layers ≥ 1); its capabilities then judge
//     draft_model, draft_kv_dtype (drafter_settings.h) and depth. A drafter whose factory needs the loaded model
//     (memory, weights, a checkpoint) is left to load time, with a note saying so.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {

struct RecipeCheck {
  std::optional<Recipe> recipe;    // absent when the file could not be read or parsed
  std::vector<Status> problems;    // everything that stops the recipe from running as written
  std::vector<std::string> notes;  // what was left unverified until load, and how "auto" resolved here
  bool ok() const { return problems.empty(); }
};

// Reads the recipe (every schema problem) and checks what it could read.
RecipeCheck check_recipe_file(const std::filesystem::path& file, const std::vector<std::string>& overrides,
                              const Registry& registry);

// The checks beyond the schema on a resolved recipe, appended to `out`.
void check_recipe(const Recipe& recipe, const Registry& registry, RecipeCheck& out);

}  // namespace kiln
