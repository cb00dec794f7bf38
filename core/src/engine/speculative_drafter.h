// Creates the drafter a recipe selects (`[speculative] method`) through the registry, built-ins and plugins
// alike, lending it the target's draft layers.
#pragma once

#include <memory>

#include "kiln/drafter.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {

// `host` may be null for drafters that need no target layers; it must outlive the drafter.
Result<std::shared_ptr<Drafter>> create_drafter(const Recipe& recipe, const Registry& registry, const ModelInfo& info,
                                                DraftHost* host);

}  // namespace kiln
