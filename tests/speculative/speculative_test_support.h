// Shared setup for the speculative tests: the MTP fixture model (glm4_moe_lite-tiny, random weights with an
// MTP layer), the draft-mtp plugin loaded from the build tree, and a recipe that selects it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/speculative_drafter.h"
#include "model/draft_host.h"
#include "model/model_loader.h"
#include "plugin/plugin_loader.h"
#include "common/reference_fixture.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::testing {

// Loads kiln-draft-mtp.so into the global registry once per process.
inline void load_mtp_plugin() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(std::filesystem::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-draft-mtp.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string() << " (build the kiln-plugin-draft-mtp target)";
}

// The target runs on the exact fp32 KV layout so batched verification and single-token decoding agree to
// fp32 rounding; block size 4 makes short sequences span several pages.
inline Recipe mtp_recipe(const std::string& model = "glm4_moe_lite-tiny", int depth = 3) {
  load_mtp_plugin();
  auto r = load_recipe("",
                       {"model.path=" + model_dir(model).string(), "kv.layout=fp32", "kv.block_size=4",
                        "speculative.method=mtp", "speculative.depth=" + std::to_string(depth)},
                       global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

inline LoadedModel load_with_mtp(const Recipe& recipe, bool load_mtp = true) {
  auto m = load_model(recipe, global_registry(), {.load_mtp = load_mtp});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

}  // namespace kiln::testing
