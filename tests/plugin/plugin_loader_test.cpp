#include <gtest/gtest.h>

#include <filesystem>

#include "kiln/collective.h"
#include "kiln/kv_layout.h"
#include "plugin/plugin_loader.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

fs::path fixture(const std::string& name) { return fs::path(KILN_TEST_PLUGIN_DIR) / ("kiln-" + name + ".so"); }

TEST(PluginLoader, LoadsGoodPluginAndCreatesObjects) {
  Registry registry;
  PluginLoader loader(registry);
  ASSERT_TRUE(loader.load_file(fixture("test-good")).ok());
  ASSERT_EQ(loader.loaded().size(), 1u);
  EXPECT_EQ(loader.loaded()[0].name, "test-good");
  EXPECT_EQ(loader.loaded()[0].version, "1.2.3");
  ASSERT_EQ(loader.loaded()[0].provides.size(), 1u);
  EXPECT_EQ(loader.loaded()[0].provides[0].first, PluginKind::kCollective);

  const CapabilityEntry* e = registry.find(PluginKind::kCollective, "loopback");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->provider, "test-good");
  ASSERT_NE(e->schema.find("loopback_world"), nullptr);

  RecipeSection section("transport");
  section.set("loopback_world", int64_t{3});
  CreateContext ctx;
  ctx.section = &section;
  auto made = registry.create<Collective>("loopback", ctx);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  EXPECT_EQ((*made)->world_size(), 3);  // the plugin's code ran and read its recipe key
  float in[2] = {1, 2}, out[2] = {};
  EXPECT_TRUE((*made)->all_gather(in, out, 2, DType::kF32, {}).ok());
  EXPECT_EQ(out[1], 2.0f);
}

TEST(PluginLoader, RefusesOtherAbiMajorNamingBothVersionsAndFile) {
  Registry registry;
  PluginLoader loader(registry);
  Status s = loader.load_file(fixture("test-wrong-abi"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ABI " + std::to_string(KILN_ABI_MAJOR + 1) + ".0"), std::string::npos) << s.message();
  const std::string host_abi = "ABI " + std::to_string(KILN_ABI_MAJOR) + "." + std::to_string(KILN_ABI_MINOR);
  EXPECT_NE(s.message().find(host_abi), std::string::npos) << s.message();
  ASSERT_EQ(loader.refused().size(), 1u);
  EXPECT_NE(loader.refused()[0].path.find("kiln-test-wrong-abi.so"), std::string::npos);
  EXPECT_TRUE(loader.loaded().empty());
}

// MlaAttendArgs grew out_lse in ABI 2.7: a kv_layout built against 2.6 is refused, naming the change.
TEST(PluginLoader, RefusesKvLayoutBuiltBeforeAbi27) {
  Registry registry;
  PluginLoader loader(registry);
  Status s = loader.load_file(fixture("test-old-kv-layout"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kv_layout `old_layout` was built for ABI 2.6"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("changed in ABI 2.7"), std::string::npos) << s.message();
  EXPECT_TRUE(loader.loaded().empty());
}

// Collective grew a virtual in ABI 2.6 (all_reduce_moe_combine_norm): a collective built against 2.5 is refused.
TEST(PluginLoader, RefusesCollectiveBuiltBeforeAbi26) {
  Registry registry;
  PluginLoader loader(registry);
  Status s = loader.load_file(fixture("test-old-collective"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("collective `old_collective` was built for ABI 2.5"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("changed in ABI 2.6"), std::string::npos) << s.message();
  EXPECT_TRUE(loader.loaded().empty());
}

TEST(PluginLoader, RefusesLibraryWithoutEntryPoint) {
  Registry registry;
  PluginLoader loader(registry);
  Status s = loader.load_file(fixture("test-no-entry"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kiln_plugin_descriptor"), std::string::npos) << s.message();
}

TEST(PluginLoader, RefusesCorruptFile) {
  Registry registry;
  PluginLoader loader(registry);
  Status s = loader.load_file(fixture("test-corrupt"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot be loaded as a shared library"), std::string::npos) << s.message();
}

TEST(PluginLoader, RefusesDuplicateNameWholePlugin) {
  Registry registry;
  PluginLoader loader(registry);
  ASSERT_TRUE(loader.load_file(fixture("test-good")).ok());
  Status s = loader.load_file(fixture("test-duplicate"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("collective `loopback`"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("test-good"), std::string::npos) << s.message();
  // All or nothing: the duplicate's other, non-clashing capability is not registered either.
  EXPECT_EQ(registry.find(PluginKind::kCollective, "loopback-extra"), nullptr);
  EXPECT_EQ(registry.find(PluginKind::kCollective, "loopback")->provider, "test-good");
}

// A plugin of the 1.x SDK (host-fp32 interfaces) cannot run against the device-aware 2.0 one.
TEST(PluginLoader, RefusesAbi1PluginsNamingBothVersions) {
  Registry registry;
  PluginLoader loader(registry);
  Status s = loader.load_file(fixture("test-abi1"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ABI 1.1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("ABI 2."), std::string::npos) << s.message();
  ASSERT_EQ(loader.refused().size(), 1u);
  EXPECT_NE(loader.refused()[0].path.find("kiln-test-abi1.so"), std::string::npos);
}

// A capability is created only on the devices it registered for; the refusal names both.
TEST(PluginLoader, CapabilitiesRunOnlyOnTheirDevices) {
  Registry registry;
  PluginLoader loader(registry);
  ASSERT_TRUE(loader.load_file(fixture("test-good")).ok());
  EXPECT_EQ(registry.find(PluginKind::kCollective, "loopback")->devices, DeviceSet::cpu());
  CreateContext ctx;
  ctx.device = Device::cuda(0);
  auto made = registry.create<Collective>("loopback", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(made.status().message().find("implemented on cpu, not on cuda"), std::string::npos)
      << made.status().message();
  // An unknown name says no plugin provides it.
  auto unknown = registry.create<KvLayout>("fp8_ds_mla", CreateContext{});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("no plugin provides kv_layout `fp8_ds_mla`"), std::string::npos)
      << unknown.status().message();
}

TEST(PluginLoader, RefusesPluginThatThrows) {
  Registry registry;
  PluginLoader loader(registry);
  Status s = loader.load_file(fixture("test-throws"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("boom during registration"), std::string::npos) << s.message();
}

TEST(PluginLoader, DirectoryLoadsGoodFilesAndRecordsEveryRefusal) {
  Registry registry;
  PluginLoader loader(registry);
  loader.load_directory(KILN_TEST_PLUGIN_DIR);
  // test-good and test-duplicate clash: whichever sorts first wins, the other is refused.
  EXPECT_EQ(loader.loaded().size(), 1u);
  // corrupt, no-entry, wrong-abi, abi1, old-kv-layout, old-collective, throws, the loser of the clash
  EXPECT_EQ(loader.refused().size(), 8u);
  EXPECT_NE(registry.find(PluginKind::kCollective, "loopback"), nullptr);
}

TEST(PluginLoader, SearchPathOrder) {
  ::setenv("KILN_PLUGIN_PATH", "/tmp/kiln-a:/tmp/kiln-b", 1);
  auto dirs = plugin_search_path({"/tmp/kiln-cli"});
  ::unsetenv("KILN_PLUGIN_PATH");
  ASSERT_GE(dirs.size(), 4u);
  EXPECT_EQ(dirs[0], fs::path("/tmp/kiln-cli"));
  EXPECT_EQ(dirs[1], fs::path("/tmp/kiln-a"));
  EXPECT_EQ(dirs[2], fs::path("/tmp/kiln-b"));
  EXPECT_NE(dirs[3].string().find("lib/kiln/plugins"), std::string::npos);
}

TEST(PluginLoader, OnlyKilnNamedLibrariesAreCandidates) {
  EXPECT_TRUE(is_plugin_file_name("/x/kiln-draft-mtp.so"));
  EXPECT_FALSE(is_plugin_file_name("/x/libkiln_core.so"));
  EXPECT_FALSE(is_plugin_file_name("/x/kiln-notes.txt"));
}

}  // namespace
}  // namespace kiln
