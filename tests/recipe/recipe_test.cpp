#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "plugin/staging_registrar.h"
#include "recipe/closest_match.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

// Factories are never called by recipe validation; any function pointer will do.
void never_called() {}

// A registry shaped like a real one: selector defaults plus two KV layouts, one of which adds a key.
Registry make_registry() {
  Registry r;
  std::vector<CapabilityEntry> entries;
  auto add = [&](PluginKind kind, std::string name, SectionSchema schema = {}) {
    CapabilityEntry e;
    e.kind = kind;
    e.name = std::move(name);
    e.schema = std::move(schema);
    e.factory = &never_called;
    e.devices = DeviceSet::cpu();
    e.provider = "test";
    entries.push_back(std::move(e));
  };
  KeySpec align;
  align.name = "page_align";
  align.type = ValueType::kInteger;
  align.default_value = int64_t{128};
  add(PluginKind::kWeightFormat, "dense");
  add(PluginKind::kKvLayout, "bf16");
  add(PluginKind::kKvLayout, "paged16", {{align}});
  add(PluginKind::kDrafter, "none");
  add(PluginKind::kCollective, "local");
  add(PluginKind::kModality, "text");
  EXPECT_TRUE(r.add_all(std::move(entries)).ok());
  return r;
}

fs::path recipe(const std::string& name) { return fs::path(KILN_SOURCE_DIR) / "tests/data/recipes" / name; }

TEST(Recipe, ValidRecipeWithExtendsResolvesEverySection) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("good.toml"), {}, reg);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sources.size(), 2u);  // base.toml then good.toml
  EXPECT_EQ(r->section("model").get_string("device"), "cpu");                  // from base.toml
  EXPECT_EQ(r->section("scheduler").get_int("max_num_seqs"), 4);               // from base.toml
  EXPECT_EQ(r->section("scheduler").get_int("max_num_batched_tokens"), 2048);  // default
  EXPECT_EQ(r->section("kv").get_int("block_size"), 16);
  EXPECT_EQ(r->section("kv").get_int("page_align"), 256);  // key owned by the selected plugin
  EXPECT_EQ(r->section("speculative").get_int("depth"), 5);
  // Relative paths resolve against the file that set them (base.toml), not the working directory.
  fs::path model = r->section("model").get_string("path");
  EXPECT_EQ(model, (recipe("") / "../models/glm4_moe_lite-tiny").lexically_normal());
  EXPECT_NE(r->section("model").origin("device").find("base.toml:4"), std::string::npos);
}

TEST(Recipe, UnknownSectionGetsLineAndSuggestion) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("typo.toml"), {}, reg);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("unknown key `spec.depth`"), std::string::npos) << m;
  EXPECT_NE(m.find("typo.toml:5"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean `speculative.depth`?"), std::string::npos) << m;
}

TEST(Recipe, UnknownKeyGetsSuggestion) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("typo_key.toml"), {}, reg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("typo_key.toml:5"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("did you mean `scheduler.max_num_seqs`?"), std::string::npos)
      << r.status().message();
}

TEST(Recipe, WrongTypeNamesLineAndExpectedType) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("wrong_type.toml"), {}, reg);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("`scheduler.max_num_seqs` in "), std::string::npos) << m;
  EXPECT_NE(m.find("wrong_type.toml:5"), std::string::npos) << m;
  EXPECT_NE(m.find("expected an integer, got string"), std::string::npos) << m;
}

TEST(Recipe, SyntaxErrorNamesLineAndColumn) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("bad_syntax.toml"), {}, reg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad_syntax.toml:3:"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("invalid TOML"), std::string::npos);
}

TEST(Recipe, ExtendsCycleIsDetected) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("cycle_a.toml"), {}, reg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("`extends` cycle"), std::string::npos) << r.status().message();
}

TEST(Recipe, UnknownPluginListsAvailableAndSuggests) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("unknown_plugin.toml"), {}, reg);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("no plugin provides kv_layout `paged61`"), std::string::npos) << m;
  EXPECT_NE(m.find("available: bf16, paged16"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean `paged16`?"), std::string::npos) << m;
}

TEST(Recipe, PluginKeysOnlyValidWithTheirPlugin) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("plugin_key.toml"), {"kv.layout=bf16"}, reg);
  ASSERT_FALSE(r.ok());  // page_align belongs to paged16, not bf16
  EXPECT_NE(r.status().message().find("unknown key `kv.page_align`"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("the kv_layout `bf16` does not take it; it belongs to the kv_layout `paged16`"),
            std::string::npos)
      << r.status().message();
  auto ok = load_recipe(recipe("plugin_key.toml"), {"kv.layout=paged16"}, reg);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->section("kv").get_int("page_align"), 64);
}

// transport.custom_all_reduce and transport.env configure NCCL: they belong to a collective that provides it, and the
// built-in `local` refuses them, saying what would give them an effect.
TEST(Recipe, NcclKeysBelongToTheCollectiveThatDeclaresThem) {
  Registry reg = make_registry();  // no collective declares them
  auto none = load_recipe(recipe("base.toml"), {"transport.custom_all_reduce=on"}, reg);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("`transport.custom_all_reduce` in --set transport.custom_all_reduce=on: the "
                                         "collective `local` does not take it"),
            std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("no collective plugin providing NCCL is loaded"), std::string::npos)
      << none.status().message();
  auto env = load_recipe(recipe("base.toml"), {"transport.env={NCCL_CUMEM_ENABLE=\"0\"}"}, reg);
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("`transport.env`"), std::string::npos) << env.status().message();
  EXPECT_NE(env.status().message().find("no collective plugin providing NCCL is loaded"), std::string::npos)
      << env.status().message();

  // A collective that declares them takes them; with `local` selected they are pointed at it.
  KeySpec car;
  car.name = "custom_all_reduce";
  car.default_value = std::string("auto");
  car.allowed = {"auto", "on", "off"};
  KeySpec env_key;
  env_key.name = "env";
  env_key.type = ValueType::kStringTable;
  env_key.default_value = StringTable{};
  CapabilityEntry nccl;
  nccl.kind = PluginKind::kCollective;
  nccl.name = "nccl";
  nccl.schema = {{car, env_key}};
  nccl.factory = &never_called;
  nccl.devices = DeviceSet::cuda();
  nccl.provider = "test";
  ASSERT_TRUE(reg.add_all({nccl}).ok());
  auto taken = load_recipe(recipe("nccl_keys.toml"), {}, reg);
  ASSERT_TRUE(taken.ok()) << taken.status().to_string();
  EXPECT_EQ(taken->section("transport").get_string("custom_all_reduce"), "off");
  EXPECT_EQ(taken->section("transport").get_table("env").at("NCCL_CUMEM_ENABLE"), "0");
  auto local = load_recipe(recipe("nccl_keys.toml"), {"transport.backend=local"}, reg);
  ASSERT_FALSE(local.ok());
  EXPECT_NE(local.status().message().find("the collective `local` does not take it; it belongs to the collective "
                                          "`nccl` (set `transport.backend`)"),
            std::string::npos)
      << local.status().message();
}

TEST(Recipe, NonFiniteNumbersAreRefused) {
  Registry reg = make_registry();
  for (const char* v : {"nan", "inf", "-inf"}) {
    auto r = load_recipe(recipe("good.toml"), {std::string("scheduler.gpu_memory_utilization=") + v}, reg);
    ASSERT_FALSE(r.ok()) << v;
    EXPECT_NE(
        r.status().message().find("`scheduler.gpu_memory_utilization` in --set scheduler.gpu_memory_utilization=" +
                                  std::string(v) + ": " + v + " is not a finite number"),
        std::string::npos)
        << r.status().message();
  }
}

// Tensor parallelism reads as a recipe (its ranks are checked where the model loads); decode-context parallelism
// is refused by the reader.
TEST(Recipe, DecodeContextParallelismMustDivideTheTensorRanksAndBothAreRead) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("good.toml"), {"parallel.decode_context=2"}, reg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("`parallel.decode_context` (--set parallel.decode_context=2): 2 does not divide "
                                      "parallel.tensor = 1"),
            std::string::npos)
      << r.status().message();
  auto tp = load_recipe(recipe("good.toml"), {"parallel.tensor=4", "parallel.decode_context=2"}, reg);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  EXPECT_EQ(tp->section("parallel").get_int("tensor", 1), 4);
  EXPECT_EQ(tp->section("parallel").get_int("decode_context", 1), 2);
  EXPECT_TRUE(load_recipe(recipe("good.toml"), {"parallel.tensor=1"}, reg).ok());
}

TEST(Recipe, EveryProblemIsReported) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("typo.toml"), {"scheduler.max_num_seqs=many", "kv.block_size=0"}, reg);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("unknown key `spec.depth`"), std::string::npos) << m;
  EXPECT_NE(m.find("`scheduler.max_num_seqs` in --set scheduler.max_num_seqs=many: expected an integer"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("`kv.block_size` in --set kv.block_size=0: 0 is below the minimum 1"), std::string::npos) << m;
}

TEST(Recipe, MissingRequiredKey) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("missing_path.toml"), {}, reg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing required key `model.path`"), std::string::npos);
}

TEST(Recipe, OverridesAreTypeChecked) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("good.toml"), {"speculative.depth=3", "scheduler.gpu_memory_utilization=0.5",
                                             "scheduler.prefix_caching=false", "server.host=0.0.0.0"},
                       reg);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->section("speculative").get_int("depth"), 3);
  EXPECT_DOUBLE_EQ(r->section("scheduler").get_float("gpu_memory_utilization"), 0.5);
  EXPECT_FALSE(r->section("scheduler").get_bool("prefix_caching", true));
  EXPECT_EQ(r->section("server").get_string("host"), "0.0.0.0");  // not valid TOML → a bare string
  EXPECT_EQ(r->section("speculative").origin("depth"), "--set speculative.depth=3");

  auto bad = load_recipe(recipe("good.toml"), {"speculative.depth=abc"}, reg);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--set speculative.depth=abc: expected an integer, got string"),
            std::string::npos)
      << bad.status().message();
  auto range = load_recipe(recipe("good.toml"), {"speculative.depth=99"}, reg);
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("above the maximum 16"), std::string::npos) << range.status().message();
  auto enum_typo = load_recipe(recipe("good.toml"), {"model.device=cdua"}, reg);
  ASSERT_FALSE(enum_typo.ok());
  EXPECT_NE(enum_typo.status().message().find("did you mean `cuda`?"), std::string::npos);
  auto malformed = load_recipe(recipe("good.toml"), {"depth=3"}, reg);
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("section.key"), std::string::npos);
}

TEST(Recipe, ShowRoundTripsThroughToml) {
  Registry reg = make_registry();
  auto r = load_recipe(recipe("good.toml"), {"speculative.depth=4"}, reg);
  ASSERT_TRUE(r.ok());
  std::string text = r->to_toml();
  EXPECT_NE(text.find("[speculative]"), std::string::npos) << text;
  EXPECT_NE(text.find("depth = 4"), std::string::npos) << text;
  // The printed recipe is itself a valid recipe that resolves to the same values.
  fs::path tmp = fs::temp_directory_path() / "kiln_recipe_show_test.toml";
  {
    std::ofstream(tmp) << text;
  }
  auto again = load_recipe(tmp, {}, reg);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  for (const auto& [name, section] : r->sections) EXPECT_EQ(again->section(name).values(), section.values()) << name;
  fs::remove(tmp);
}

TEST(ClosestMatch, SuggestsOnlyPlausibleTypos) {
  std::vector<std::string> keys = {"speculative.depth", "scheduler.max_num_seqs", "kv.layout"};
  EXPECT_EQ(closest_match("kv.layuot", keys), "kv.layout");
  EXPECT_EQ(closest_match("spec.depth", keys), "speculative.depth");
  EXPECT_EQ(closest_match("completely.different", keys), std::nullopt);
}

}  // namespace
}  // namespace kiln
