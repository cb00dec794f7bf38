// The JSON Schema subset `kiln qualify` checks answers with (apps/kiln/json_schema_check.cpp): a violation of each
// keyword is caught and located, and a keyword outside the subset is refused rather than ignored.
#include "json_schema_check.h"

#include <gtest/gtest.h>

namespace kiln::cli {
namespace {

using nlohmann::json;

const json kPerson = json::parse(R"({"type":"object","properties":{"name":{"type":"string","minLength":1},
    "age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","maxItems":2,"items":{"enum":["a","b"]}}},
    "required":["name","age"],"additionalProperties":false})");

TEST(JsonSchemaCheck, AcceptsAValidValue) {
  EXPECT_EQ(json_schema_violation(kPerson, json::parse(R"({"name":"Ada","age":36,"tags":["a"]})")), "");
  EXPECT_EQ(json_schema_violation(kPerson, json::parse(R"({"name":"Ada","age":36.0})")), "");  // 36.0 is an integer
}

TEST(JsonSchemaCheck, LocatesEachViolation) {
  auto violation = [](const char* value) { return json_schema_violation(kPerson, json::parse(value)); };
  EXPECT_EQ(violation(R"({"name":"Ada"})"), "/: missing required property `age`");
  EXPECT_EQ(violation(R"({"name":"Ada","age":"36"})"), "/age: expected \"integer\", got string");
  EXPECT_EQ(violation(R"({"name":"Ada","age":36.5})"), "/age: expected \"integer\", got number");
  EXPECT_EQ(violation(R"({"name":"Ada","age":200})"), "/age: 200 is above the maximum 150");
  EXPECT_EQ(violation(R"({"name":"","age":1})"), "/name: string shorter than minLength");
  EXPECT_EQ(violation(R"({"name":"Ada","age":1,"x":1})"), "/: unexpected property `x`");
  EXPECT_EQ(violation(R"({"name":"Ada","age":1,"tags":["a","c"]})"), "/tags/1: \"c\" is not one of [\"a\",\"b\"]");
  EXPECT_EQ(violation(R"({"name":"Ada","age":1,"tags":["a","b","a"]})"), "/tags: 3 items, more than maxItems 2");
  EXPECT_EQ(violation(R"([1])"), "/: expected \"object\", got array");
}

TEST(JsonSchemaCheck, RefusesKeywordsOutsideItsSubset) {
  const json schema = json::parse(R"({"type":"string","pattern":"^a"})");
  EXPECT_EQ(json_schema_violation(schema, "b"), "/: the schema uses `pattern`, which this checker does not implement");
}

}  // namespace
}  // namespace kiln::cli
