// Canvas and content sizes against the processor's (canvas.json): 1-pixel sides, the minimum-token upscale, the
// maximum-token binary search, panoramas; and the budget that cannot hold one patch.
#include "image_canvas.h"

#include <gtest/gtest.h>

#include "vision_test_support.h"

namespace kiln::vision {
namespace {

TEST(ImageCanvas, MatchesTransformers) {
  const auto fixture = testing::read_json("canvas.json");
  const ImageProcessorConfig config;
  ASSERT_GE(fixture["cases"].size(), 80u);
  for (const auto& c : fixture["cases"]) {
    const int64_t h = c["in"][0], w = c["in"][1];
    auto plan = plan_canvas(h, w, config);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->canvas_height, c["canvas"][0].get<int64_t>()) << h << "x" << w;
    EXPECT_EQ(plan->canvas_width, c["canvas"][1].get<int64_t>()) << h << "x" << w;
    EXPECT_EQ(plan->content_height, c["content"][0].get<int64_t>()) << h << "x" << w;
    EXPECT_EQ(plan->content_width, c["content"][1].get<int64_t>()) << h << "x" << w;
    const int64_t tokens = plan->canvas_height * plan->canvas_width / (28 * 28);
    EXPECT_LE(tokens, config.max_image_tokens) << h << "x" << w;
  }
}

TEST(ImageCanvas, BothBudgetBranches) {
  const ImageProcessorConfig config;
  auto tiny = plan_canvas(10, 10, config);  // 2·28·28 < 16·1568: scaled up to the minimum
  ASSERT_TRUE(tiny.ok());
  EXPECT_GE(tiny->canvas_height * tiny->canvas_width / (28 * 28), config.min_image_tokens);
  EXPECT_GT(tiny->content_height, 10);
  auto huge = plan_canvas(6000, 8000, config);  // over 8000 tokens: shrunk by the binary search
  ASSERT_TRUE(huge.ok());
  EXPECT_LE(huge->canvas_height * huge->canvas_width / (28 * 28), config.max_image_tokens);
  EXPECT_EQ(huge->canvas_height % 28, 0);
  EXPECT_EQ(huge->canvas_width % 28, 0);
}

TEST(ImageCanvas, RefusesABudgetBelowOnePatch) {
  ImageProcessorConfig config;
  config.max_image_tokens = 0;
  auto plan = plan_canvas(5000, 5000, config);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("max_image_tokens"), std::string::npos);
  EXPECT_FALSE(plan_canvas(0, 10, ImageProcessorConfig{}).ok());
}

}  // namespace
}  // namespace kiln::vision
