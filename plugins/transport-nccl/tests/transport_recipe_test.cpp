// The plugin as the core sees it (CPU, no GPU needed): loaded from the build tree, it registers `nccl` for CUDA and
// its [transport] keys, which the recipe loader then validates; `local` points at it for its keys.
#include <gtest/gtest.h>

#include <filesystem>

#include "kiln/collective.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::nccl {
namespace {
namespace fs = std::filesystem;

Registry& registry_with_plugin() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-transport-nccl.so");
  }();
  EXPECT_TRUE(loaded.ok()) << loaded.to_string();
  return global_registry();
}

fs::path base_recipe() {
  return fs::path(KILN_SOURCE_DIR) / "tests/data/recipes/base.toml";
}

TEST(TransportRecipe, PluginRegistersNcclForCuda) {
  Registry& reg = registry_with_plugin();
  const CapabilityEntry* e = nullptr;
  for (const auto* c : reg.list(PluginKind::kCollective))
    if (c->name == "nccl") e = c;
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->devices, DeviceSet::cuda());
  EXPECT_NE(e->schema.find("custom_all_reduce"), nullptr);
  EXPECT_NE(e->schema.find("custom_all_reduce_force_fail"), nullptr);
  EXPECT_NE(e->schema.find("env"), nullptr);
}

TEST(TransportRecipe, KeysAreValidatedAgainstThePluginSchema) {
  Registry& reg = registry_with_plugin();
  auto ok = load_recipe(base_recipe(),
                        {"transport.backend=nccl", "transport.custom_all_reduce=off",
                         "transport.custom_all_reduce_force_fail=true", "transport.env={NCCL_P2P_DISABLE=\"1\"}"},
                        reg);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  const RecipeSection& t = ok->section("transport");
  EXPECT_EQ(t.get_string("custom_all_reduce"), "off");
  EXPECT_TRUE(t.get_bool("custom_all_reduce_force_fail"));
  EXPECT_EQ(t.get_table("env").at("NCCL_P2P_DISABLE"), "1");

  auto defaults = load_recipe(base_recipe(), {"transport.backend=nccl"}, reg);
  ASSERT_TRUE(defaults.ok()) << defaults.status().to_string();
  EXPECT_EQ(defaults->section("transport").get_string("custom_all_reduce"), "auto");

  auto bad_mode = load_recipe(base_recipe(), {"transport.backend=nccl", "transport.custom_all_reduce=maybe"}, reg);
  ASSERT_FALSE(bad_mode.ok());
  EXPECT_NE(bad_mode.status().message().find("custom_all_reduce"), std::string::npos) << bad_mode.status().message();
  EXPECT_NE(bad_mode.status().message().find("maybe"), std::string::npos) << bad_mode.status().message();

  auto bad_type = load_recipe(base_recipe(), {"transport.backend=nccl", "transport.env=\"NCCL_DEBUG=INFO\""}, reg);
  ASSERT_FALSE(bad_type.ok());

  auto local = load_recipe(base_recipe(), {"transport.custom_all_reduce=on"}, reg);
  ASSERT_FALSE(local.ok());
  EXPECT_NE(local.status().message().find("it belongs to the collective `nccl` (set `transport.backend`)"),
            std::string::npos)
      << local.status().message();
}

TEST(TransportRecipe, CreatingOnTheCpuIsRefused) {
  Registry& reg = registry_with_plugin();
  CreateContext ctx;
  ctx.device = Device::cpu();
  auto made = reg.create<Collective>("nccl", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("implemented on cuda, not on cpu"), std::string::npos)
      << made.status().message();
}

}  // namespace
}  // namespace kiln::nccl
