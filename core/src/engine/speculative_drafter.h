// Creates the drafter a recipe selects (`[speculative] method`) through the registry, built-ins and plugins
// alike, on the model's device with the engine's DraftServices.
#pragma once

#include <memory>

#include "kiln/device_context.h"
#include "kiln/draft_services.h"
#include "kiln/drafter.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {

// `services` may be null for drafters that need none; it must outlive the drafter. Checks what the drafter needs
// against the recipe (recipe/drafter_settings.h): a checkpoint of its own needs `speculative.draft_model`, and one
// that loads none refuses it; `speculative.draft_kv_dtype` is refused by a drafter with no caches of its own.
Result<std::shared_ptr<Drafter>> create_drafter(const Recipe& recipe, const Registry& registry, const ModelInfo& info,
                                                DeviceContext& device, DraftServices* services);

}  // namespace kiln
