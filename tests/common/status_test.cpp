#include <gtest/gtest.h>

#include "kiln/status.h"

namespace kiln {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value must be positive, got " + std::to_string(v));
  return v;
}

Status use(int v, int* out) {
  KILN_ASSIGN_OR_RETURN(*out, parse_positive(v));
  return ok_status();
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = not_found("tensor `a.weight` missing");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.to_string(), "not found: tensor `a.weight` missing");
  EXPECT_EQ(s.with_context("model.safetensors").message(), "model.safetensors: tensor `a.weight` missing");
}

TEST(Result, PropagatesErrors) {
  int out = 0;
  EXPECT_TRUE(use(3, &out).ok());
  EXPECT_EQ(out, 3);
  Status s = use(-1, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("-1"), std::string::npos);
}

}  // namespace
}  // namespace kiln
