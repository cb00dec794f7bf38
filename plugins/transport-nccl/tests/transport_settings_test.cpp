// [transport] as the `nccl` collective reads it, and transport.env: only NCCL_* names, the process environment
// winning over the recipe.
#include "transport_settings.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "nccl_env_settings.h"

namespace kiln::nccl {
namespace {

TEST(NcclEnv, TakesNcclNamesOnly) {
  EXPECT_TRUE(check_nccl_env({{"NCCL_P2P_DISABLE", "1"}, {"NCCL_CUMEM_ENABLE", "0"}}).ok());
  EXPECT_TRUE(check_nccl_env({}).ok());
  for (const char* bad :
       {"LD_PRELOAD", "PATH", "NCCL_", "nccl_debug", "NCCL_DEBUG FILE", "XNCCL_DEBUG", "NCCL-DEBUG"}) {
    Status s = check_nccl_env({{bad, "1"}});
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find(std::string("`") + bad + "` is not an NCCL setting"), std::string::npos) << s.message();
  }
  Status nul = check_nccl_env({{"NCCL_DEBUG", std::string("IN\0FO", 5)}});
  ASSERT_FALSE(nul.ok());
  EXPECT_NE(nul.message().find("NUL byte"), std::string::npos);
}

TEST(NcclEnv, TheEnvironmentWinsOverTheRecipe) {
  auto current = [](const std::string& name) -> std::optional<std::string> {
    if (name == "NCCL_DEBUG") return "INFO";
    if (name == "NCCL_P2P_DISABLE") return "1";
    return std::nullopt;
  };
  auto plan = plan_nccl_env({{"NCCL_DEBUG", "WARN"}, {"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "1"}}, current);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].name, "NCCL_DEBUG");
  ASSERT_TRUE(plan[0].kept.has_value());
  EXPECT_EQ(*plan[0].kept, "INFO");
  EXPECT_FALSE(plan[1].kept.has_value());  // same value: nothing to keep
  EXPECT_FALSE(plan[2].kept.has_value());
}

TEST(NcclEnv, ApplySetsTheProcessEnvironment) {
  ::unsetenv("NCCL_KILN_TEST_APPLIED");
  ::setenv("NCCL_KILN_TEST_KEPT", "mine", 1);
  ASSERT_TRUE(apply_nccl_env({{"NCCL_KILN_TEST_APPLIED", "7"}, {"NCCL_KILN_TEST_KEPT", "recipe"}}).ok());
  ASSERT_NE(std::getenv("NCCL_KILN_TEST_APPLIED"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_KILN_TEST_APPLIED"), "7");
  EXPECT_STREQ(std::getenv("NCCL_KILN_TEST_KEPT"), "mine");
  EXPECT_FALSE(apply_nccl_env({{"HOME", "/tmp"}}).ok());
}

TEST(TransportSettings, SchemaDeclaresTheKeysWithDefaults) {
  const SectionSchema schema = transport_schema();
  ASSERT_NE(schema.find("custom_all_reduce"), nullptr);
  EXPECT_EQ(schema.find("custom_all_reduce")->allowed, (std::vector<std::string>{"auto", "on", "off"}));
  ASSERT_NE(schema.find("custom_all_reduce_force_fail"), nullptr);
  EXPECT_EQ(schema.find("custom_all_reduce_force_fail")->type, ValueType::kBool);
  ASSERT_NE(schema.find("env"), nullptr);
  EXPECT_EQ(schema.find("env")->type, ValueType::kStringTable);
  ASSERT_NE(schema.find("timeout_s"), nullptr);
  EXPECT_EQ(schema.find("timeout_s")->type, ValueType::kInteger);
  EXPECT_EQ(schema.find("timeout_s")->min, 1);
}

TEST(TransportSettings, ReadsTheSection) {
  auto defaults = read_transport_settings(nullptr);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->custom_all_reduce, CustomAllReduceMode::kAuto);
  EXPECT_FALSE(defaults->force_probe_failure);
  EXPECT_EQ(defaults->timeout, std::chrono::seconds(300));

  RecipeSection s("transport");
  s.set("custom_all_reduce", std::string("on"));
  s.set("custom_all_reduce_force_fail", true);
  s.set("env", StringTable{{"NCCL_CUMEM_ENABLE", "0"}});
  auto read = read_transport_settings(&s);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->custom_all_reduce, CustomAllReduceMode::kOn);
  EXPECT_TRUE(read->force_probe_failure);
  EXPECT_EQ(read->env.at("NCCL_CUMEM_ENABLE"), "0");
  EXPECT_EQ(read->timeout, std::chrono::seconds(300));
  s.set("timeout_s", int64_t{7});
  EXPECT_EQ(read_transport_settings(&s)->timeout, std::chrono::seconds(7));

  s.set("env", StringTable{{"LD_PRELOAD", "/tmp/x.so"}}, "r.toml:9");
  auto bad = read_transport_settings(&s);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("`transport.env` (r.toml:9): `LD_PRELOAD` is not an NCCL setting"),
            std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace kiln::nccl
