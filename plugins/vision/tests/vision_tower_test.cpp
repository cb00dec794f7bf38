// The CPU vision tower against transformers 5.17 (Glm5NextModel.get_image_features) on tiny random towers
// (tests/data/tower-*, made by tools/make_vision_tower_fixtures.py): patch sizes 14, 4 and 2; 2, 3 and 4 heads;
// depths 1–3; square, wide and tall grids; several images per call, and a two-frame entry whose frames attend
// separately. Weights are bf16 values, computed in fp32 on both sides.
//
// Tolerance: max|Δ| / max|ref| < 1e-5. Both sides are fp32 with the same operations; what differs is summation
// order (SIMD dot products here, MKL/oneDNN blocking in torch) and libm's exp/erf/cos, which leave relative
// differences of a few 1e-7 per operation; through 1–3 blocks and the merger the measured worst case is printed.
#include "vision_tower.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "tensor_file.h"
#include "vision_config.h"
#include "tower_fixture.h"
#include "vision_test_support.h"
#include "vision_weights.h"

namespace kiln::vision {
namespace {

using testing::data_dir;
using testing::load_fixture;
using testing::read_grids;
using testing::relative_error;
using testing::synthetic_pixels;
using testing::TowerFixture;

class VisionTower : public ::testing::TestWithParam<std::pair<std::string, int64_t>> {};

TEST_P(VisionTower, EmbeddingsMatchTransformers) {
  const auto [name, seed] = GetParam();
  TowerFixture f = load_fixture(name);
  for (int call = 0;; ++call) {
    const std::string key = "tower_" + std::to_string(call);
    const auto grids = read_grids(f.reference, key + "_grid");
    if (grids.empty()) {
      EXPECT_GE(call, 2) << name << ": the fixture should hold at least two tower calls";
      break;
    }
    int64_t patches = 0;
    for (const auto& g : grids) patches += g[0] * g[1] * g[2];
    const auto pixels = synthetic_pixels(patches, f.config.patch_dim(), seed + call);
    auto got = run_vision_tower(f.config, f.weights, pixels, grids);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const int64_t tokens = patches / (f.config.spatial_merge_size * f.config.spatial_merge_size);
    auto want = f.reference.read(key + "_embeddings", {tokens, f.config.out_hidden_size});
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    const double err = relative_error(*got, *want);
    std::printf("%s call %d (%zu images, %lld patches): max|Δ| / max|ref| = %.3g\n", name.c_str(), call, grids.size(),
                static_cast<long long>(patches), err);
    EXPECT_LT(err, 1e-5) << name << " call " << call;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VisionTower,
                         testing::tower_fixture_cases(), testing::tower_fixture_name);

// One image alone equals the same image inside a batch of several (segments keep images apart).
TEST(VisionTowerSegments, AnImageAloneEqualsItInABatch) {
  TowerFixture f = load_fixture("tower-heads4");
  const std::vector<std::array<int64_t, 3>> both = {{1, 4, 4}, {1, 2, 6}};
  const int64_t pd = f.config.patch_dim();
  const auto pixels = synthetic_pixels(28, pd, 9);
  auto together = run_vision_tower(f.config, f.weights, pixels, both);
  ASSERT_TRUE(together.ok());
  const std::vector<std::array<int64_t, 3>> second = {{1, 2, 6}};
  auto alone = run_vision_tower(f.config, f.weights, std::span<const float>(pixels).subspan(16 * pd), second);
  ASSERT_TRUE(alone.ok());
  const int64_t out = f.config.out_hidden_size;
  ASSERT_EQ(alone->size(), static_cast<size_t>(3 * out));
  for (int64_t i = 0; i < 3 * out; ++i) EXPECT_EQ((*alone)[i], (*together)[4 * out + i]) << i;
}

// Each row's sums run in one thread in a fixed order: the team size changes no bit.
TEST(VisionTowerSegments, TheThreadCountChangesNothing) {
  TowerFixture f = load_fixture("tower-heads3");
  const std::vector<std::array<int64_t, 3>> grids = {{1, 8, 8}, {1, 2, 14}};
  const auto pixels = synthetic_pixels(92, f.config.patch_dim(), 3);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = run_vision_tower(f.config, f.weights, pixels, grids);
  omp_set_num_threads(3);
  auto three = run_vision_tower(f.config, f.weights, pixels, grids);
  omp_set_num_threads(before);
  ASSERT_TRUE(one.ok() && three.ok());
  EXPECT_EQ(*one, *three);
}

TEST(VisionTowerSegments, BadGridsAreErrors) {
  TowerFixture f = load_fixture("tower-heads4");
  const std::vector<float> pixels(static_cast<size_t>(6 * f.config.patch_dim()));
  const std::vector<std::array<int64_t, 3>> odd = {{1, 2, 3}};
  auto r = run_vision_tower(f.config, f.weights, pixels, odd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("merge blocks"), std::string::npos) << r.status().message();
  const std::vector<std::array<int64_t, 3>> bigger = {{1, 4, 4}};
  EXPECT_FALSE(run_vision_tower(f.config, f.weights, pixels, bigger).ok());
}

TEST(VisionWeights, MissingOrMisshapenTensorsAreNamed) {
  auto tensors = CheckpointTensors::open(data_dir() / "tower-heads4");
  ASSERT_TRUE(tensors.ok());
  std::ifstream in(data_dir() / "tower-heads4" / "config.json");
  VisionConfig c = *parse_vision_config(nlohmann::json::parse(in));
  EXPECT_TRUE(check_vision_weights(*tensors, c).ok());
  c.depth = 2;  // one block more than stored
  Status s = check_vision_weights(*tensors, c);
  EXPECT_NE(s.message().find("model.visual.blocks.1.norm1.weight"), std::string::npos) << s.message();
  c.depth = 1, c.intermediate_size = 41;
  s = check_vision_weights(*tensors, c);
  EXPECT_NE(s.message().find("mlp.gate_proj.weight is [40, 32]"), std::string::npos) << s.message();
}

TEST(VisionConfigParse, RefusesWhatTheTowerCannotRun) {
  auto base = nlohmann::json::parse(std::ifstream(data_dir() / "tower-heads4" / "config.json"));
  EXPECT_TRUE(parse_vision_config(base).ok());
  auto no_vision = base;
  no_vision.erase("vision_config");
  EXPECT_NE(parse_vision_config(no_vision).status().message().find("no vision_config"), std::string::npos);
  auto other = base;
  other["model_type"] = "glm4_moe_lite";
  EXPECT_FALSE(parse_vision_config(other).ok());
  auto act = base;
  act["vision_config"]["hidden_act"] = "gelu";
  EXPECT_NE(parse_vision_config(act).status().message().find("hidden_act"), std::string::npos);
  // Keys of the wrong JSON type are refused, not thrown.
  auto typed = base;
  typed["model_type"] = 5;
  EXPECT_FALSE(parse_vision_config(typed).ok());
  typed = base;
  typed["vision_config"]["hidden_act"] = 7;
  EXPECT_NE(parse_vision_config(typed).status().message().find("hidden_act"), std::string::npos);
  typed = base;
  typed["vision_config"]["rope_parameters"] = {{"rope_type", nullptr}, {"rope_theta", 10000.0}};
  EXPECT_NE(parse_vision_config(typed).status().message().find("rope_type"), std::string::npos);
  auto heads = base;
  heads["vision_config"]["num_heads"] = 3;  // 32 / 3
  EXPECT_FALSE(parse_vision_config(heads).ok());
}

}  // namespace
}  // namespace kiln::vision
