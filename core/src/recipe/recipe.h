// A resolved recipe: every section with its values after `extends`, --set overrides and defaults,
// validated against the core's schema and the schemas of the plugins it selects.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/recipe.h"
#include "plugin/registry.h"

namespace kiln {

struct Recipe {
  std::filesystem::path file;                   // the recipe named on the command line
  std::vector<std::filesystem::path> sources;   // it and every file it extends, base first
  std::vector<std::string> overrides;           // the --set arguments applied, in order
  std::map<std::string, RecipeSection> sections;

  const RecipeSection& section(const std::string& name) const;
  // The resolved recipe as TOML (what `kiln recipe show` prints).
  std::string to_toml() const;
};

// A value as TOML writes it: "text", 3, 0.5, true, { A = "1" }.
std::string render_recipe_value(const RecipeValue& v);

// What reading a recipe found: the recipe (absent only when a file could not be read or parsed) and every problem
// with it. A value that failed validation is left out of the recipe, default included, so checks that follow skip
// it instead of judging a value the file never chose.
struct RecipeRead {
  std::optional<Recipe> recipe;
  std::vector<Status> problems;
};

// Loads `file`, follows `extends`, applies `overrides` ("section.key=value"), validates every key against
// the schema of its owner (core or the plugin named by the section's selector key, looked up in `registry`),
// and refuses settings whose feature kiln does not have yet (parallel.tensor > 1).
// An empty `file` builds the recipe from the overrides and defaults alone (`kiln generate --model DIR`).
RecipeRead read_recipe(const std::filesystem::path& file, const std::vector<std::string>& overrides,
                       const Registry& registry);

// read_recipe, successful only without problems; the error lists every one, a line each.
Result<Recipe> load_recipe(const std::filesystem::path& file, const std::vector<std::string>& overrides,
                           const Registry& registry);

// One Status for several: the first one's code, the messages a line each (ok when `problems` is empty).
Status join_problems(const std::vector<Status>& problems);

}  // namespace kiln
