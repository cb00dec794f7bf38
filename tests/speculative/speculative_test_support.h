// Shared setup for the speculative tests: the MTP fixture model (glm4_moe_lite-tiny, random weights with an
// MTP layer), the draft-mtp plugin loaded from the build tree, a recipe that selects it, and a drafter over the
// engine's DraftServices with a cache pool holding the target's layers and its next-n layer.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "engine/engine_draft_services.h"
#include "engine/speculative_drafter.h"
#include "model/model_loader.h"
#include "plugin/plugin_loader.h"
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
inline std::vector<std::string> mtp_sets(const std::string& model = "glm4_moe_lite-tiny", int depth = 3) {
  return {"model.path=" + model_dir(model).string(), "kv.layout=fp32", "kv.block_size=4", "speculative.method=mtp",
          "speculative.depth=" + std::to_string(depth)};
}
inline Recipe mtp_recipe(const std::string& model = "glm4_moe_lite-tiny", int depth = 3) {
  load_mtp_plugin();
  auto r = load_recipe("", mtp_sets(model, depth), global_registry());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

inline LoadedModel load_with_mtp(const Recipe& recipe, bool load_mtp = true) {
  auto m = load_model(recipe, global_registry(), {.load_mtp = load_mtp});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

// A drafter of the recipe over the engine's services, with a pool of `tokens` tokens (the target's layers and its
// loaded next-n layers, as the engine makes it) whose blocks the test hands out.
struct DraftFixture {
  Recipe recipe;
  LoadedModel m;
  TestKv kv;
  std::unique_ptr<EngineDraftServices> services;
  std::shared_ptr<Drafter> drafter;

  explicit DraftFixture(const std::string& model = "glm4_moe_lite-tiny", int64_t tokens = 512)
      : recipe(mtp_recipe(model)), m(load_with_mtp(recipe)), kv(m, tokens) {
    services = std::make_unique<EngineDraftServices>(*m.model, m.format, m.info.num_layers, "");
    services->attach(&kv.manager(), static_cast<int64_t>(kv.views().layers.size()));
    auto d = create_drafter(recipe, global_registry(), m.info, *m.device, services.get());
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    if (d.ok()) drafter = std::move(d).value();
  }
};

}  // namespace kiln::testing
