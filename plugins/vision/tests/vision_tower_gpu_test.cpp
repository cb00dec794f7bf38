// The vision tower on CUDA (cuda/vision_tower_cuda.*) against the CPU tower and transformers' fixtures, and the
// `image` modality and glm5_next's CUDA runner with images. Tolerances: plain fp32 products (Math::kFp32) agree
// with the CPU to 1e-5 of the largest value, as the CPU agrees with transformers (summation order, exp/erf); TF32
// products (the default: 10-bit mantissas in the tensor cores' multiplies) within 1e-2, the measured worst printed.
#include <gtest/gtest.h>

#include <cstdio>

#include <fstream>

#include "cuda/vision_tower_cuda.h"
#include "image_modality.h"
#include "kiln/modality.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "tower_fixture.h"
#include "vision_tower.h"

namespace kiln::vision {
namespace {

using testing::data_dir;
using testing::load_fixture;
using testing::read_grids;
using testing::relative_error;
using testing::synthetic_pixels;
using testing::TowerFixture;

class CudaTower : public ::testing::TestWithParam<std::pair<std::string, int64_t>> {};

TEST_P(CudaTower, MatchesTheCpuTowerAndTransformers) {
  const auto [name, seed] = GetParam();
  TowerFixture f = load_fixture(name);
  auto fp32 = CudaVisionTower::create(f.config, f.weights, 0, CudaVisionTower::Math::kFp32);
  auto tf32 = CudaVisionTower::create(f.config, f.weights, 0, CudaVisionTower::Math::kTf32);
  ASSERT_TRUE(fp32.ok() && tf32.ok()) << fp32.status().to_string() << tf32.status().to_string();
  for (int call = 0;; ++call) {
    const std::string key = "tower_" + std::to_string(call);
    const auto grids = read_grids(f.reference, key + "_grid");
    if (grids.empty()) break;
    int64_t patches = 0;
    for (const auto& g : grids) patches += g[0] * g[1] * g[2];
    const auto pixels = synthetic_pixels(patches, f.config.patch_dim(), seed + call);
    auto cpu = run_vision_tower(f.config, f.weights, pixels, grids);
    auto exact = (*fp32)->run(pixels, grids);
    auto fast = (*tf32)->run(pixels, grids);
    ASSERT_TRUE(cpu.ok() && exact.ok() && fast.ok()) << exact.status().to_string() << fast.status().to_string();
    const int64_t tokens = patches / (f.config.spatial_merge_size * f.config.spatial_merge_size);
    auto want = f.reference.read(key + "_embeddings", {tokens, f.config.out_hidden_size});
    ASSERT_TRUE(want.ok());
    const double e_cpu = relative_error(*exact, *cpu), e_ref = relative_error(*exact, *want);
    const double e_tf32 = relative_error(*fast, *cpu);
    std::printf("%s call %d: GPU fp32 vs CPU %.3g, vs transformers %.3g; GPU TF32 vs CPU %.3g\n", name.c_str(), call,
                e_cpu, e_ref, e_tf32);
    EXPECT_LT(e_cpu, 1e-5);
    EXPECT_LT(e_ref, 1e-5);
    EXPECT_LT(e_tf32, 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTower,
                         testing::tower_fixture_cases(), testing::tower_fixture_name);

// Attention in query chunks (the score budget forcing chunks of 1–3 queries) gives what one chunk per frame gives,
// and an image alone what it gives among others; a bad grid is an error, not a launch.
TEST(CudaTowerChunks, QueryChunksAndBatchingChangeNothing) {
  TowerFixture f = load_fixture("tower-heads3");
  const std::vector<std::array<int64_t, 3>> grids = {{1, 8, 8}, {1, 2, 14}};
  const auto pixels = synthetic_pixels(92, f.config.patch_dim(), 3);
  auto whole = CudaVisionTower::create(f.config, f.weights, 0, CudaVisionTower::Math::kFp32);
  const size_t tiny = sizeof(float) * f.config.num_heads * 64 * 2;  // two queries of the 64-patch frame
  auto chunked = CudaVisionTower::create(f.config, f.weights, 0, CudaVisionTower::Math::kFp32, tiny);
  ASSERT_TRUE(whole.ok() && chunked.ok());
  auto a = (*whole)->run(pixels, grids);
  auto b = (*chunked)->run(pixels, grids);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
  EXPECT_LT(relative_error(*b, *a), 1e-6);
  const std::vector<std::array<int64_t, 3>> second = {{1, 2, 14}};
  auto alone = (*whole)->run(std::span<const float>(pixels).subspan(64 * f.config.patch_dim()), second);
  ASSERT_TRUE(alone.ok());
  const int64_t out = f.config.out_hidden_size;
  ASSERT_EQ(alone->size(), static_cast<size_t>(7 * out));
  std::vector<float> tail(a->end() - 7 * out, a->end());
  EXPECT_LT(relative_error(*alone, tail), 1e-6);
  const std::vector<std::array<int64_t, 3>> odd = {{1, 2, 3}};
  auto bad = (*whole)->run(std::span<const float>(pixels).first(6 * f.config.patch_dim()), odd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("merge blocks"), std::string::npos) << bad.status().to_string();
}

// The TF32 tower's flash attention (head width 16 here) over frames longer than a key tile and not a multiple of it
// (280 and 90 patches), with a one-block frame beside them: within TF32's tolerance of the fp32 tower.
TEST(CudaTowerFlash, LongAndRaggedFramesMatchTheFp32Tower) {
  TowerFixture f = load_fixture("tower-heads3");
  ASSERT_EQ(f.config.head_dim(), 16);
  const std::vector<std::array<int64_t, 3>> grids = {{1, 20, 14}, {1, 2, 2}, {1, 10, 6}, {1, 6, 10}};
  int64_t patches = 0;
  for (const auto& g : grids) patches += g[0] * g[1] * g[2];
  const auto pixels = synthetic_pixels(patches, f.config.patch_dim(), 17);
  auto fp32 = CudaVisionTower::create(f.config, f.weights, 0, CudaVisionTower::Math::kFp32);
  auto tf32 = CudaVisionTower::create(f.config, f.weights, 0, CudaVisionTower::Math::kTf32);
  ASSERT_TRUE(fp32.ok() && tf32.ok());
  auto a = (*fp32)->run(pixels, grids);
  auto b = (*tf32)->run(pixels, grids);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
  const double err = relative_error(*b, *a);
  std::printf("flash attention (TF32 tower) vs the fp32 tower on frames of 280, 4, 60 and 60 patches: %.3g\n", err);
  EXPECT_LT(err, 1e-2);
  auto cpu = run_vision_tower(f.config, f.weights, pixels, grids);
  ASSERT_TRUE(cpu.ok());
  EXPECT_LT(relative_error(*a, *cpu), 1e-5);
}

void load_plugin() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(std::filesystem::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-vision.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
}

// The plugin registers `image` for CUDA; made for a CUDA device the modality encodes there: real PNG, JPEG and WebP
// images give the CPU modality's tokens, and rows within TF32's tolerance. As
// for glm5_next's CUDA runner taking such rows is
// CUDA runner taking such rows: tests/gpu/glm5_next_cuda_test.cpp's media test (tower-e2e's tiny trunk has KDA
// heads the CUDA runner does not take).
TEST(CudaImageModality, ImagesEncodeOnTheGpuAsOnTheCpu) {
  load_plugin();
  const CapabilityEntry* entry = global_registry().find(PluginKind::kModality, "image");
  ASSERT_NE(entry, nullptr);
  EXPECT_TRUE(Registry::check_device(*entry, DeviceType::kCuda).ok());
  const std::string dir = (data_dir() / "tower-e2e").string();
  std::ifstream in(data_dir() / "tower-e2e/config.json");
  const VisionConfig config = *parse_vision_config(nlohmann::json::parse(in));
  auto on_gpu = make_image_modality(dir, config.out_hidden_size, true, 0, 0);
  auto on_cpu = make_image_modality(dir, config.out_hidden_size, true, 0, -1);
  ASSERT_TRUE(on_gpu.ok() && on_cpu.ok()) << on_gpu.status().to_string() << on_cpu.status().to_string();
  EXPECT_TRUE((*on_gpu)->on_device());
  EXPECT_FALSE((*on_cpu)->on_device());
  for (const auto& [name, mime] : {std::pair{"tiny_rgb.png", "image/png"}, {"photo.jpg", "image/jpeg"},
                                    {"panorama.webp", "image/webp"}}) {
    const auto bytes = testing::read_bytes(data_dir() / "images" / name);
    ASSERT_FALSE(bytes.empty()) << name;
    const MediaItem item{mime, bytes};
    auto g = (*on_gpu)->encode(item, Stream{});
    auto c = (*on_cpu)->encode(item, Stream{});
    ASSERT_TRUE(g.ok() && c.ok()) << g.status().to_string() << c.status().to_string();
    EXPECT_EQ(g->tokens, c->tokens);
    ASSERT_EQ(g->embeddings.size(), c->embeddings.size());
    const double err = relative_error(g->embeddings, c->embeddings);
    std::printf("%s through the tower: %lld tokens, GPU (TF32) vs CPU rows %.3g\n", name,
                static_cast<long long>(g->num_embeddings), err);
    EXPECT_LT(err, 1e-2);
  }
}

}  // namespace
}  // namespace kiln::vision
