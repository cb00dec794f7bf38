// The `image` modality under model.load = "dummy" (ModelInfo::synthetic_weights): a tower of vision_config's shapes
// with random weights (random_vision_weights: uniform with std 0.02 like the core's dummy weights, norms 1, seeded),
// made without reading any safetensors, on the CPU here (the CUDA tower's copy is compared in
// vision_tower_gpu_test.cpp). The checkpoint folder tower-e2e gives the tiny vision_config; a copy of its config.json
// alone proves nothing else is read.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "image_decode.h"
#include "image_modality.h"
#include "image_processor.h"
#include "kiln/modality.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "runtime/cpu_device_context.h"
#include "tensor_file.h"
#include "vision_test_support.h"
#include "vision_tower.h"

namespace kiln::vision {
namespace {

namespace fs = std::filesystem;
using testing::data_dir;

VisionConfig tiny_config() {
  std::ifstream in(data_dir() / "tower-e2e/config.json");
  return *parse_vision_config(nlohmann::json::parse(in));
}

// A folder holding only tower-e2e's config.json: no safetensors for a tower to be read from.
fs::path config_only_dir() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("kiln_dummy_tower_" + std::to_string(::getpid()));
    fs::create_directories(d);
    fs::copy_file(data_dir() / "tower-e2e/config.json", d / "config.json", fs::copy_options::overwrite_existing);
    return d;
  }();
  return dir;
}

MediaItem png(const char* name) { return MediaItem{"image/png", testing::read_bytes(data_dir() / "images" / name)}; }

// Every tensor's size, in visiting order, for comparing two sets of weights' shapes.
std::vector<size_t> sizes(const VisionWeights& w) {
  std::vector<size_t> s = {w.patch_w.size(), w.patch_b.size(), w.post_norm.size(), w.down_w.size(),
                           w.down_b.size(), w.merger_proj.size(), w.merger_norm_w.size(), w.merger_norm_b.size(),
                           w.merger_gate.size(), w.merger_up.size(), w.merger_down.size()};
  for (const VisionBlockWeights& b : w.blocks)
    for (const std::vector<float>* v : {&b.norm1, &b.norm2, &b.qkv_w, &b.qkv_b, &b.q_norm, &b.k_norm, &b.proj_w,
                                        &b.proj_b, &b.gate_w, &b.gate_b, &b.up_w, &b.up_b, &b.down_w, &b.down_b})
      s.push_back(v->size());
  return s;
}

double stddev(const std::vector<float>& v) {
  double sum = 0, sq = 0;
  for (float x : v) sum += x, sq += static_cast<double>(x) * x;
  const double mean = sum / v.size();
  return std::sqrt(sq / v.size() - mean * mean);
}

TEST(RandomVisionWeights, HaveTheCheckpointsShapesAndTheDummyScale) {
  const VisionConfig config = tiny_config();
  auto tensors = CheckpointTensors::open(data_dir() / "tower-e2e");
  ASSERT_TRUE(tensors.ok());
  auto stored = load_vision_weights(*tensors, config);
  ASSERT_TRUE(stored.ok()) << stored.status().to_string();
  const VisionWeights a = random_vision_weights(config, 1);
  EXPECT_EQ(sizes(a), sizes(*stored));
  // Seeded: the same seed gives the same tower, another seed another.
  const VisionWeights again = random_vision_weights(config, 1);
  const VisionWeights other = random_vision_weights(config, 2);
  EXPECT_EQ(a.blocks[1].qkv_w, again.blocks[1].qkv_w);
  EXPECT_EQ(a.merger_down, again.merger_down);
  EXPECT_NE(a.blocks[1].qkv_w, other.blocks[1].qkv_w);
  // Different tensors are different streams.
  EXPECT_NE(a.merger_gate, a.merger_up);
  // Uniform with std 0.02 (±4 % for ~1,500 values); norms 1, the LayerNorm's bias 0.
  for (const std::vector<float>* v : {&a.blocks[0].gate_w, &a.merger_gate, &a.patch_w}) {
    EXPECT_NEAR(stddev(*v), 0.02, 0.02 * 0.04) << v->size() << " values";
    for (float x : *v) ASSERT_LE(std::abs(x), 0.02f * std::sqrt(3.0f));
  }
  for (float x : a.blocks[0].norm1) EXPECT_EQ(x, 1.0f);
  for (float x : a.blocks[0].q_norm) EXPECT_EQ(x, 1.0f);
  for (float x : a.post_norm) EXPECT_EQ(x, 1.0f);
  for (float x : a.merger_norm_w) EXPECT_EQ(x, 1.0f);
  for (float x : a.merger_norm_b) EXPECT_EQ(x, 0.0f);
}

TEST(DummyImageModality, EncodesOnTheCpuFromConfigJsonAlone) {
  const VisionConfig config = tiny_config();
  const std::string dir = config_only_dir().string();
  // Without the dummy seed the folder is refused: there is no tower to read.
  EXPECT_FALSE(make_image_modality(dir, 32, true).ok());
  auto dummy = make_image_modality(dir, 32, true, 0, -1, uint64_t{1});
  ASSERT_TRUE(dummy.ok()) << dummy.status().to_string();
  auto stored = make_image_modality((data_dir() / "tower-e2e").string(), 32, true);
  ASSERT_TRUE(stored.ok()) << stored.status().to_string();

  const MediaItem item = png("tiny_rgb.png");
  auto e = (*dummy)->encode(item, Stream{});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto s = (*stored)->encode(item, Stream{});
  ASSERT_TRUE(s.ok());
  // The prompt tokens are the processor's and the config's: the same as with the checkpoint's tower.
  EXPECT_EQ(e->tokens, s->tokens);
  EXPECT_EQ(e->num_embeddings, s->num_embeddings);
  ASSERT_EQ(e->embeddings.size(), s->embeddings.size());
  EXPECT_NE(e->embeddings, s->embeddings);
  // The rows are the CPU tower's on random_vision_weights(config, 1).
  auto image = decode_image(item.bytes);
  ASSERT_TRUE(image.ok());
  auto processed = process_image(*image);
  ASSERT_TRUE(processed.ok());
  const std::array<std::array<int64_t, 3>, 1> grid = {processed->grid_thw};
  auto rows = run_vision_tower(config, random_vision_weights(config, 1), processed->pixel_values, grid);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(e->embeddings, *rows);
  bool nonzero = false;
  for (float x : e->embeddings) {
    ASSERT_TRUE(std::isfinite(x));
    nonzero |= x != 0.0f;
  }
  EXPECT_TRUE(nonzero);

  // Made only to be checked (`kiln recipe check`: no device context), the tower is made on the first image: the same.
  auto checked = make_image_modality(dir, 32, false, 0, -1, uint64_t{1});
  ASSERT_TRUE(checked.ok()) << checked.status().to_string();
  auto lazy = (*checked)->encode(item, Stream{});
  ASSERT_TRUE(lazy.ok()) << lazy.status().to_string();
  EXPECT_EQ(lazy->embeddings, e->embeddings);
}

// The seam: the plugin's factory reads ModelInfo::synthetic_weights / weight_seed, which the core sets for
// model.load = "dummy".
TEST(DummyImageModality, ThePluginMakesARandomTowerWhenTheModelIsDummy) {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-vision.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  ModelInfo info;
  info.model_type = "glm5_next";
  info.hidden_size = 32;
  info.checkpoint_dir = config_only_dir().string();
  info.synthetic_weights = true;
  info.weight_seed = 1;
  CpuDeviceContext device;
  CreateContext ctx;
  ctx.device = device.device();
  ctx.device_context = &device;
  ctx.model = &info;
  auto modality = global_registry().create<Modality>("image", ctx);
  ASSERT_TRUE(modality.ok()) << modality.status().to_string();
  auto e = (*modality)->encode(png("palette_trns.png"), Stream{});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto direct = make_image_modality(info.checkpoint_dir, 32, true, 0, -1, uint64_t{1});
  ASSERT_TRUE(direct.ok());
  auto want = (*direct)->encode(png("palette_trns.png"), Stream{});
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(e->tokens, want->tokens);
  EXPECT_EQ(e->embeddings, want->embeddings);
  // `kiln recipe check` of a dummy recipe: no device context, nothing to read, accepted.
  ctx.device_context = nullptr;
  EXPECT_TRUE(global_registry().create<Modality>("image", ctx).ok());
  // Not dummy, the same folder has no tower.
  info.synthetic_weights = false;
  EXPECT_FALSE(global_registry().create<Modality>("image", ctx).ok());
}

}  // namespace
}  // namespace kiln::vision
