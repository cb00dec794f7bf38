// The [speculative] keys only some drafters read, judged by what the selected drafter declares (its capabilities):
// `draft_model` is required by a drafter that loads a checkpoint of its own and refused by the others;
// `draft_kv_dtype` sets the dtype of a drafter's own KV caches and is refused (unless left at its default) by a
// drafter that keeps none (mtp's next-n KV follows the target's kv.layout). Used where the drafter is created for the
// engine (create_drafter) and by `kiln recipe check`, so both say the same.
#pragma once

#include <vector>

#include "kiln/drafter.h"
#include "kiln/recipe.h"
#include "kiln/status.h"

namespace kiln {

// Every problem with `speculative` (the resolved [speculative] section) for a drafter with `caps`; empty when none.
std::vector<Status> check_drafter_settings(const RecipeSection& speculative, const DrafterCapabilities& caps);

}  // namespace kiln
