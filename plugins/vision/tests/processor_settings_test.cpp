// preprocessor_config.json as the image modality reads it: absent → Glm5NextImageProcessor's defaults; present →
// its canvas budget and mean/std; sizes that disagree with the tower, and steps turned off, refused by name.
#include "processor_settings.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace kiln::vision {
namespace {

namespace fs = std::filesystem;

class ProcessorSettings : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln-processor-settings-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "preprocessor_config.json") << text; }
  fs::path dir_;
  VisionConfig vision_;  // patch 14, temporal 2, merge 2
};

TEST_F(ProcessorSettings, NoFileGivesTheProcessorsDefaults) {
  auto p = processor_settings(dir_, vision_);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->min_image_tokens, 16);
  EXPECT_EQ(p->max_image_tokens, 8000);
  EXPECT_EQ(p->factor(), 28);
  EXPECT_EQ(p->image_mean[0], 0.48145466f);
}

TEST_F(ProcessorSettings, TheFilesBudgetAndNormalisationApply) {
  write(R"({"image_processor_type": "Glm5NextImageProcessor", "patch_size": 14, "merge_size": 2,
            "temporal_patch_size": 2, "min_image_tokens": 4, "max_image_tokens": 1024,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25], "do_resize": true,
            "rescale_factor": 0.00392156862745098, "resample": 3})");
  auto p = processor_settings(dir_, vision_);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->min_image_tokens, 4);
  EXPECT_EQ(p->max_image_tokens, 1024);
  EXPECT_EQ(p->image_mean[1], 0.5f);
  EXPECT_EQ(p->image_std[2], 0.25f);
}

TEST_F(ProcessorSettings, DisagreementsAndSkippedStepsAreRefused) {
  auto message = [&](const std::string& text) {
    write(text);
    auto p = processor_settings(dir_, vision_);
    return p.ok() ? std::string() : p.status().message();
  };
  EXPECT_NE(message(R"({"merge_size": 3})").find("merge_size 3 differs from the vision tower's 2"), std::string::npos);
  EXPECT_NE(message(R"({"patch_size": 16})").find("patch_size 16"), std::string::npos);
  EXPECT_NE(message(R"({"do_normalize": false})").find("do_normalize = false"), std::string::npos);
  EXPECT_NE(message(R"({"resample": 2})").find("bicubic"), std::string::npos);
  EXPECT_NE(message(R"({"rescale_factor": 1.0})").find("1/255"), std::string::npos);
  EXPECT_NE(message(R"({"min_image_tokens": 10, "max_image_tokens": 5})").find("1 <= min <= max"), std::string::npos);
  EXPECT_NE(message(R"({"image_std": [0.2, 0.0, 0.2]})").find("positive"), std::string::npos);
  EXPECT_NE(message(R"({"image_mean": [0.2, 0.2]})").find("three numbers"), std::string::npos);
  EXPECT_NE(message("[1, 2]").find("not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace kiln::vision
