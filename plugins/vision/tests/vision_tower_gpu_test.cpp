// The vision tower on CUDA (cuda/vision_tower_cuda.*) against the CPU tower and transformers' fixtures, and the
// `image` modality and glm5_next's CUDA runner with images. Tolerances: plain fp32 products (Math::kFp32) agree
// with the CPU to 1e-5 of the largest value, as the CPU agrees with transformers (summation order, exp/erf); TF32
// products (the default: 10-bit mantissas in the tensor cores' multiplies) within 1e-2, the measured worst printed.
#include <gtest/gtest.h>

#include <cstdio>

#include "common/glm5_next_test_model.h"
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
                         ::testing::Values(std::make_pair(std::string("tower-e2e"), int64_t{5101}),
                                           std::make_pair(std::string("tower-heads4"), int64_t{5202}),
                                           std::make_pair(std::string("tower-heads3"), int64_t{5303})),
                         [](const auto& info) {
                           std::string n = info.param.first;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

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

void load_plugin() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(std::filesystem::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-vision.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
}

LoadedModel load_e2e(const std::string& device, const std::string& layout) {
  auto recipe = load_recipe("",
                            {"model.path=" + (data_dir() / "tower-e2e").string(), "model.device=" + device,
                             "kv.layout=" + layout, "kv.block_size=16", "model.threads=2"},
                            global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

Result<std::shared_ptr<Modality>> modality_for(const LoadedModel& m) {
  CreateContext ctx;
  ctx.device = m.device->device();
  ctx.device_context = m.device.get();
  ctx.model = &m.info;
  return global_registry().create<Modality>("image", ctx);
}

// The plugin on a CUDA model encodes on the GPU: a real PNG's rows as the CPU modality's within TF32's tolerance;
// then a prompt with that image through glm5_next's CUDA runner: logits as the CPU model's with the same rows
// (glm5_next's GPU tolerance, 6e-2 of the largest logit), and far from the logits without the image.
TEST(CudaImageModality, APngOnTheGpuAndThroughGlm5NextsCudaRunner) {
  load_plugin();
  LoadedModel gpu = load_e2e("cuda", "bf16");
  LoadedModel cpu = load_e2e("cpu", "fp32");
  auto on_gpu = modality_for(gpu);
  auto on_cpu = modality_for(cpu);
  ASSERT_TRUE(on_gpu.ok() && on_cpu.ok()) << on_gpu.status().to_string() << on_cpu.status().to_string();
  auto* image = dynamic_cast<ImageModality*>(on_gpu->get());
  ASSERT_NE(image, nullptr);
  EXPECT_TRUE(image->on_device());
  const MediaItem item{"image/png", testing::read_bytes(data_dir() / "images/tiny_rgb.png")};
  auto g = (*on_gpu)->encode(item, Stream{});
  auto c = (*on_cpu)->encode(item, Stream{});
  ASSERT_TRUE(g.ok() && c.ok()) << g.status().to_string() << c.status().to_string();
  ASSERT_EQ(g->tokens, c->tokens);
  const double rows_err = relative_error(g->embeddings, c->embeddings);
  std::printf("PNG through the tower: GPU (TF32) vs CPU rows %.3g\n", rows_err);
  EXPECT_LT(rows_err, 1e-2);

  std::vector<int32_t> prompt = {11, 12, 13};
  prompt.insert(prompt.end(), g->tokens.begin(), g->tokens.end());
  for (int32_t t : {14, 15, 16, 17}) prompt.push_back(t);
  const int64_t n = static_cast<int64_t>(prompt.size()), vocab = gpu.model->vocab_size();
  const MediaRows rows{3 + g->first_placeholder, g->num_embeddings, c->embeddings.data()};
  auto logits = [&](LoadedModel& m, bool with_image) {
    kiln::testing::Glm5NextCache cache(m, 128, 1);
    std::vector<int32_t> table = cache.table(n);
    SequenceStep step{prompt, 0, &table, true, 0, {}};
    if (with_image) step.media = std::span<const MediaRows>(&rows, 1);
    StepOptions o;
    o.want_logits = true;
    StepOutput out;
    const Status s = m.model->step({&step, 1}, {}, cache.views(), o, out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out.logits;
  };
  const auto g_img = logits(gpu, true), c_img = logits(cpu, true), g_txt = logits(gpu, false);
  ASSERT_EQ(g_img.size(), static_cast<size_t>(n * vocab));
  ASSERT_EQ(c_img.size(), g_img.size());
  double worst = 0, apart = 0;
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<float> gr(g_img.begin() + r * vocab, g_img.begin() + (r + 1) * vocab);
    const std::vector<float> cr(c_img.begin() + r * vocab, c_img.begin() + (r + 1) * vocab);
    const std::vector<float> tr(g_txt.begin() + r * vocab, g_txt.begin() + (r + 1) * vocab);
    worst = std::max(worst, relative_error(gr, cr));
    if (r == n - 1) apart = relative_error(tr, cr);
  }
  std::printf("glm5_next with an image: GPU vs CPU logits worst row %.3g; last row without the image %.3g\n", worst,
              apart);
  EXPECT_LT(worst, 6e-2);
  EXPECT_GT(apart, 2 * worst) << "the image rows did not reach the GPU's embeddings";
}

}  // namespace
}  // namespace kiln::vision
