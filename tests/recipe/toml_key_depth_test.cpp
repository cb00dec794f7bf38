// The bound on key nesting checked before toml++ reads a recipe (recipe/toml_key_depth.h): a header or dotted key of
// 50,000 parts is an error naming the file and line (it overflowed toml++'s stack before); real recipes, strings,
// comments and float arrays with many dots pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "recipe/toml_key_depth.h"

namespace kiln {
namespace {

std::string dotted(int parts) {
  std::string s = "a";
  for (int i = 1; i < parts; ++i) s += ".a";
  return s;
}

TEST(TomlKeyDepth, DeepHeadersAndKeysAreNamedWithTheirLine) {
  const std::string header = "[model]\npath = \"x\"\n[" + dotted(50000) + "]\n";
  Status s = check_toml_key_depth(header, "deep.toml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("deep.toml:3: a key of more than 64"), std::string::npos) << s.message();
  s = check_toml_key_depth("# comment\n" + dotted(65) + " = 1\n", "k.toml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("k.toml:2:"), std::string::npos) << s.message();
  EXPECT_FALSE(check_toml_key_depth("[[" + dotted(100) + "]]\n", "arr.toml").ok());
  EXPECT_TRUE(check_toml_key_depth(dotted(64) + " = 1\n", "ok.toml").ok());
}

TEST(TomlKeyDepth, DotsInValuesStringsAndCommentsDoNotCount) {
  std::string floats = "x = [\n";
  for (int i = 0; i < 200; ++i) floats += "  0.5, 1.25,\n";
  floats += "  [";  // a nested array's line starts with `[` too: its commas say it is no header
  for (int i = 0; i < 200; ++i) floats += "0.5, ";
  floats += "],\n]\n";
  EXPECT_TRUE(check_toml_key_depth(floats, "f.toml").ok());
  const std::string many(500, '.');
  EXPECT_TRUE(check_toml_key_depth("s = \"" + many + "\"\nt = '" + many + "'\n# " + many + "\n", "s.toml").ok());
  EXPECT_TRUE(check_toml_key_depth("m = \"\"\"\n" + dotted(100) + " = 1\n[" + dotted(100) + "]\n\"\"\"\nk = 1\n",
                                   "m.toml")
                  .ok());
  EXPECT_TRUE(check_toml_key_depth("\"" + dotted(100) + "\" = 1\n", "q.toml").ok());  // one quoted part
  EXPECT_TRUE(check_toml_key_depth("x = { " + dotted(100) + " = 1 }\n", "inline.toml").ok());  // toml++ bounds these
  // After a multi-line string closes, keys are checked again.
  EXPECT_FALSE(check_toml_key_depth("m = '''\nx\n'''\n" + dotted(70) + " = 1\n", "after.toml").ok());
}

TEST(TomlKeyDepth, TheRecipeLoaderRefusesADeepHeaderFile) {
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "kiln_deep_header.toml";
  std::ofstream(file) << "[" << dotted(50000) << "]\n";
  const auto r = load_recipe(file.string(), {}, Registry{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(file.string() + ":1: a key of more than 64"), std::string::npos)
      << r.status().message();
  std::filesystem::remove(file);
  // A --set value is TOML too, newlines and all.
  const auto set = load_recipe("", {"model.path=1\n[" + dotted(50000) + "]"}, Registry{});
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("a key of more than 64"), std::string::npos) << set.status().message();
}

}  // namespace
}  // namespace kiln
