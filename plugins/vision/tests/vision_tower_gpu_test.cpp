// The vision tower on CUDA (cuda/vision_tower_cuda.*) against the CPU tower and transformers' fixtures, and the
// `image` modality and glm5_next's CUDA runner with images. Tolerances: plain fp32 products (Math::kFp32) agree
// with the CPU to 1e-5 of the largest value, as the CPU agrees with transformers (summation order, exp/erf); TF32
// products (the default: 10-bit mantissas in the tensor cores' multiplies) within 1e-2, the measured worst printed.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cuda/vision_tower_cuda.h"
#include "engine/engine_factory.h"
#include "image_modality.h"
#include "kiln/modality.h"
#include "model/model_loader.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
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

// model.load = "dummy": the random tower (random_vision_weights, seeded as the core seeds the model) made on the host
// and uploaded, against the same random tower on the CPU, from a folder holding only tower-e2e's config.json.
// Tolerance as for the checkpoint's tower: TF32 products within 1e-2 of the largest value.
TEST(CudaDummyImageModality, TheRandomTowerOnTheGpuMatchesItOnTheCpu) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kiln_dummy_tower_gpu_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(data_dir() / "tower-e2e/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  auto on_gpu = make_image_modality(dir.string(), 32, true, 0, 0, uint64_t{1});
  auto on_cpu = make_image_modality(dir.string(), 32, true, 0, -1, uint64_t{1});
  ASSERT_TRUE(on_gpu.ok() && on_cpu.ok()) << on_gpu.status().to_string() << on_cpu.status().to_string();
  EXPECT_TRUE((*on_gpu)->on_device());
  for (const auto& [name, mime] : {std::pair{"tiny_rgb.png", "image/png"}, {"photo.jpg", "image/jpeg"}}) {
    const MediaItem item{mime, testing::read_bytes(data_dir() / "images" / name)};
    auto g = (*on_gpu)->encode(item, Stream{});
    auto c = (*on_cpu)->encode(item, Stream{});
    ASSERT_TRUE(g.ok() && c.ok()) << g.status().to_string() << c.status().to_string();
    EXPECT_EQ(g->tokens, c->tokens);
    ASSERT_EQ(g->embeddings.size(), c->embeddings.size());
    const double err = relative_error(g->embeddings, c->embeddings);
    std::printf("%s through the random tower: GPU (TF32) vs CPU rows %.3g\n", name, err);
    EXPECT_LT(err, 1e-2);
  }
  fs::remove_all(dir);
}

// A dummy recipe with images, end to end on the GPU: a glm5_next config of the CUDA runner's widths (D 64, KDA heads of
// 128, latent 128) with tower-e2e's tiny tower (out 64) and tokenizer, and no safetensors at all; `kiln serve`'s
// server answers a chat completion with a PNG, counting its prompt tokens as on the CPU (tiny_rgb.png: grid 8×10,
// 20 merged tokens + begin and end markers).
TEST(CudaDummyImageModality, ADummyRecipeServesAnImageEndToEnd) {
  namespace fs = std::filesystem;
  load_plugin();
  const fs::path dir = fs::temp_directory_path() / ("kiln_dummy_vision_model_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ifstream in(data_dir() / "tower-e2e/config.json");
    nlohmann::json tower = nlohmann::json::parse(in);
    nlohmann::json vision = tower["vision_config"];
    vision["out_hidden_size"] = 64;
    const nlohmann::json text = {
        {"model_type", "glm5_next_text"}, {"vocab_size", 512}, {"hidden_size", 64}, {"intermediate_size", 96},
        {"moe_intermediate_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
        {"num_key_value_heads", 2}, {"q_lora_rank", 64}, {"kv_lora_rank", 128}, {"qk_nope_head_dim", 32},
        {"v_head_dim", 32}, {"n_routed_experts", 8}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
        {"max_position_embeddings", 4096}, {"pad_token_id", 0}, {"tie_word_embeddings", false},
        {"layer_types", {"linear_attention", "deepseek_sparse_attention"}}, {"mlp_layer_types", {"dense", "sparse"}},
        {"indexer_types", {"full", "full"}}, {"linear_num_heads", 2}, {"linear_head_dim", 128},
        {"linear_conv_kernel_dim", 4}, {"linear_lower_bound", -5.0}, {"hc_mult", 4}, {"index_n_heads", 4},
        {"index_head_dim", 128}, {"index_kpool", 16}, {"index_topk", 32}};
    nlohmann::json config = {{"model_type", "glm5_next"}, {"architectures", {"Glm5NextForConditionalGeneration"}},
                             {"text_config", text}, {"vision_config", vision}, {"tie_word_embeddings", false}};
    for (const char* key : {"image_start_token_id", "image_token_id", "image_end_token_id"}) config[key] = tower[key];
    std::ofstream(dir / "config.json") << config.dump(2);
    fs::copy_file(data_dir() / "tower-e2e/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  }
  auto recipe = load_recipe("",
                            {"model.path=" + dir.string(), "model.load=dummy", "model.device=cuda", "kv.layout=bf16",
                             "kv.block_size=16", "scheduler.max_model_len=1024", "scheduler.max_num_seqs=2",
                             "scheduler.max_num_batched_tokens=512", "media.modality=image", "media.max_images=2"},
                            global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto model = load_model(*recipe, global_registry());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ASSERT_TRUE(model->on_gpu());
  EXPECT_TRUE(model->info.synthetic_weights);
  auto started = start_engine(*model, *recipe);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  auto tokenizer = Tokenizer::load(dir / "tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  HttpServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.model_id = "dummy-vision";
  o.max_model_len = 1024;
  o.media.modality = started->modality;
  o.media.modality_name = "image";
  o.media.max_images = 2;
  o.media.hidden_size = model->info.hidden_size;
  auto server = std::make_unique<HttpServer>(*started->engine, *tokenizer, o);
  ASSERT_TRUE(server->start().ok());
  const std::vector<uint8_t> png = testing::read_bytes(data_dir() / "images/tiny_rgb.png");
  std::string b64(4 * ((png.size() + 2) / 3), '\0');
  {
    static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t k = 0;
    for (size_t i = 0; i < png.size(); i += 3) {
      const uint32_t n = (uint32_t{png[i]} << 16) | (i + 1 < png.size() ? uint32_t{png[i + 1]} << 8 : 0) |
                         (i + 2 < png.size() ? uint32_t{png[i + 2]} : 0);
      b64[k++] = digits[(n >> 18) & 63];
      b64[k++] = digits[(n >> 12) & 63];
      b64[k++] = i + 1 < png.size() ? digits[(n >> 6) & 63] : '=';
      b64[k++] = i + 2 < png.size() ? digits[n & 63] : '=';
    }
  }
  auto chat = [&](bool with_image) {
    nlohmann::json parts = nlohmann::json::array({{{"type", "text"}, {"text", "What is this? "}}});
    if (with_image)
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64," + b64}}}});
    const nlohmann::json body = {{"model", "dummy-vision"}, {"max_tokens", 4}, {"temperature", 0},
                                 {"messages", nlohmann::json::array({{{"role", "user"}, {"content", parts}}})}};
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    EXPECT_EQ(r ? r->status : -1, 200) << (r ? r->body : "");
    return r ? nlohmann::json::parse(r->body, nullptr, false) : nlohmann::json();
  };
  const nlohmann::json with = chat(true), without = chat(false);
  ASSERT_TRUE(with.contains("usage") && without.contains("usage")) << with.dump() << without.dump();
  EXPECT_EQ(with["usage"]["prompt_tokens"].get<int>() - without["usage"]["prompt_tokens"].get<int>(), 20 + 2);
  EXPECT_GE(with["usage"]["completion_tokens"].get<int>(), 1);
  server.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::vision
