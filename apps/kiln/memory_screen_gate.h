// The feasibility screen (engine/memory_model.h) as a gate for the commands that load recipes to measure them
// (`kiln ab`, `kiln bench decode|prefill`): each recipe's memory model is printed before anything is loaded, and
// a recipe the screen says cannot fit is refused — naming it and the shortfall — unless --ignore-screen, so a
// benchmark does not spend minutes loading weights to end in an out-of-memory error.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "engine/memory_model.h"
#include "recipe/recipe.h"

namespace kiln::cli {

// The option's help text, one place for the commands that take it.
inline constexpr const char* kIgnoreScreenHelp =
    "load even where the memory model (printed first) says the recipe cannot fit";

struct ScreenedRecipe {
  std::optional<MemoryModel> model;  // absent where the screen could not be computed (the reason is printed)
  // Non-empty on a judged no-go: "<what>: the memory model says no-go, short by X GiB: <first reason>".
  std::string refusal;
};

// Screens `recipe` and prints its report to `out` under a line naming `what` (e.g. "arm A (configs/x.toml
// --set …)"), each line prefixed with "# ".
ScreenedRecipe screen_recipe(const Recipe& recipe, const std::string& what, std::ostream& out);

}  // namespace kiln::cli
