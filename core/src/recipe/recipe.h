// A resolved recipe: every section with its values after `extends`, --set overrides and defaults,
// validated against the core's schema and the schemas of the plugins it selects.
#pragma once

#include <filesystem>
#include <map>
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

// Loads `file`, follows `extends`, applies `overrides` ("section.key=value"), validates every key against
// the schema of its owner (core or the plugin named by the section's selector key, looked up in `registry`).
// An empty `file` builds the recipe from the overrides and defaults alone (`kiln generate --model DIR`).
Result<Recipe> load_recipe(const std::filesystem::path& file, const std::vector<std::string>& overrides,
                           const Registry& registry);

}  // namespace kiln
