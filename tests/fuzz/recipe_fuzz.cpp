// A recipe file → load_recipe (toml++, extends, the core's and the built-in plugins' schemas). Errors are
// Statuses; nothing may crash or throw. `extends` can only name files that do not exist in the scratch directory.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_support.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const auto file = fuzz::scratch_file(std::string_view(reinterpret_cast<const char*>(data), size), ".toml");
  auto recipe = load_recipe(file, {}, global_registry());
  if (recipe.ok()) (void)recipe->to_toml();
  return 0;
}
