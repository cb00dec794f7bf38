// The `image` modality as the engine meets it: the plugin loaded from the build tree registers `image`; made for the
// tiny glm5_next-with-vision checkpoint (tests/data/tower-e2e) it turns a PNG into <|begin_of_image|>, one
// <|image|> per merged embedding, <|end_of_image|> and the tower's rows for the processor's pixel_values; corrupt
// bytes and checkpoints without a tower are errors. And the whole model: logits of a prompt holding two images
// (their tower rows in place of the placeholders' embeddings) against transformers 5.17's
// Glm5NextForConditionalGeneration on the same pixel_values.
//
// Logits tolerance: max|Δ| / max|ref| < 1e-4, as the text-only glm5_next fixtures (measured 1.1e-5). The text
// model's residual streams are bf16 in both (the embeddings, image rows included, are rounded where transformers
// casts them), so an image value within ~1e-7 of a bf16 rounding boundary could land on the other side here; none
// does in this fixture, and one such value moves the logits by far less than the tolerance.
#include "image_modality.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/glm5_next_test_model.h"
#include "image_decode.h"
#include "image_processor.h"
#include "kiln/modality.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "tower_fixture.h"
#include "vision_test_support.h"
#include "vision_tower.h"

namespace kiln::vision {
namespace {

namespace fs = std::filesystem;
using testing::data_dir;
using testing::synthetic_pixels;

void load_plugin() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-vision.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
}

LoadedModel load_e2e_model() {
  auto recipe = load_recipe("",
                            {"model.path=" + (data_dir() / "tower-e2e").string(), "model.device=cpu", "kv.layout=fp32",
                             "kv.block_size=16", "model.threads=1"},
                            global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

Result<std::shared_ptr<Modality>> create(const LoadedModel& m) {
  CreateContext ctx;
  ctx.device = m.device->device();
  ctx.device_context = m.device.get();
  ctx.model = &m.info;
  return global_registry().create<Modality>("image", ctx);
}

TEST(ImageModality, ThePluginRegistersImageAndEncodesAPng) {
  load_plugin();
  LoadedModel m = load_e2e_model();
  auto modality = create(m);
  ASSERT_TRUE(modality.ok()) << modality.status().to_string();
  EXPECT_FALSE((*modality)->accepts_video());
  const auto types = (*modality)->accepted_mime_types();
  EXPECT_NE(std::find(types.begin(), types.end(), "image/png"), types.end());

  MediaItem item{"image/png", testing::read_bytes(data_dir() / "images/tiny_rgb.png")};
  auto e = (*modality)->encode(item, Stream{});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  // What the processor and the tower give for the same bytes (the processor is bit-identical to transformers').
  auto tensors = CheckpointTensors::open(data_dir() / "tower-e2e");
  ASSERT_TRUE(tensors.ok());
  std::ifstream in(data_dir() / "tower-e2e/config.json");
  const VisionConfig config = *parse_vision_config(nlohmann::json::parse(in));
  auto weights = load_vision_weights(*tensors, config);
  ASSERT_TRUE(weights.ok());
  auto image = decode_image(item.bytes);
  ASSERT_TRUE(image.ok());
  auto processed = process_image(*image);
  ASSERT_TRUE(processed.ok());
  const std::array<std::array<int64_t, 3>, 1> grid = {processed->grid_thw};
  auto rows = run_vision_tower(config, *weights, processed->pixel_values, grid);
  ASSERT_TRUE(rows.ok());
  const int64_t n = processed->num_patches() / 4;
  EXPECT_GE(n, 16);  // the processor's minimum
  ASSERT_EQ(e->num_embeddings, n);
  ASSERT_EQ(e->first_placeholder, 1);
  ASSERT_EQ(static_cast<int64_t>(e->tokens.size()), n + 2);
  EXPECT_EQ(e->tokens.front(), 486);                              // <|begin_of_image|> in this checkpoint's config
  EXPECT_EQ(e->tokens.back(), 487);                               // <|end_of_image|>
  for (int64_t i = 1; i <= n; ++i) EXPECT_EQ(e->tokens[i], 510);  // <|image|>
  ASSERT_EQ(e->embeddings.size(), static_cast<size_t>(n * m.info.hidden_size));
  EXPECT_EQ(e->embeddings, *rows);
}

TEST(ImageModality, CorruptAndUnsupportedBytesAreErrors) {
  load_plugin();
  LoadedModel m = load_e2e_model();
  auto modality = create(m);
  ASSERT_TRUE(modality.ok()) << modality.status().to_string();
  std::vector<uint8_t> png = testing::read_bytes(data_dir() / "images/tiny_rgb.png");
  png.resize(png.size() / 2);
  auto truncated = (*modality)->encode(MediaItem{"image/png", png}, Stream{});
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kInvalidArgument);
  auto text = (*modality)->encode(MediaItem{"image/png", {'h', 'e', 'l', 'l', 'o'}}, Stream{});
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("not a PNG, JPEG or WebP"), std::string::npos) << text.status().message();
}

TEST(ImageModality, ACheckpointWithoutATowerIsRefusedAtCreation) {
  load_plugin();
  // Another architecture has no glm5_next tower.
  auto text_only = make_image_modality(kiln::testing::model_dir("glm4_moe_lite-tiny").string(), 32, false);
  ASSERT_FALSE(text_only.ok());
  EXPECT_NE(text_only.status().message().find("glm5_next"), std::string::npos) << text_only.status().message();
  // out_hidden_size must be the text width.
  auto narrow = make_image_modality((data_dir() / "tower-heads4").string(), 32, false);
  ASSERT_FALSE(narrow.ok());
  EXPECT_NE(narrow.status().message().find("out_hidden_size 24"), std::string::npos) << narrow.status().message();
  // Checked from headers only (recipe check): nothing is loaded until the first image.
  auto checked = make_image_modality((data_dir() / "tower-e2e").string(), 32, false);
  ASSERT_TRUE(checked.ok()) << checked.status().to_string();
  auto e =
      (*checked)->encode(MediaItem{"image/png", testing::read_bytes(data_dir() / "images/tiny_rgb.png")}, Stream{});
  EXPECT_TRUE(e.ok()) << e.status().to_string();
}

TEST(ImageModality, ARepeatedImageSkipsTheTower) {
  const std::string dir = (data_dir() / "tower-e2e").string();
  const MediaItem a{"image/png", testing::read_bytes(data_dir() / "images/tiny_rgb.png")};
  const MediaItem b{"image/png", testing::read_bytes(data_dir() / "images/palette_trns.png")};
  auto cached = make_image_modality(dir, 32, true, /*cache_mib=*/16);
  ASSERT_TRUE(cached.ok()) << cached.status().to_string();
  auto first = (*cached)->encode(a, Stream{});
  auto other = (*cached)->encode(b, Stream{});
  auto again = (*cached)->encode(a, Stream{});
  ASSERT_TRUE(first.ok() && other.ok() && again.ok());
  EXPECT_EQ((*cached)->tower_runs(), 2u);
  EXPECT_EQ((*cached)->cache_hits(), 1u);
  EXPECT_EQ(again->tokens, first->tokens);
  EXPECT_EQ(again->embeddings, first->embeddings);
  EXPECT_NE(other->embeddings, first->embeddings);
  auto uncached = make_image_modality(dir, 32, true, /*cache_mib=*/0);
  ASSERT_TRUE(uncached.ok());
  ASSERT_TRUE((*uncached)->encode(a, Stream{}).ok());
  auto again_uncached = (*uncached)->encode(a, Stream{});
  ASSERT_TRUE(again_uncached.ok());
  EXPECT_EQ((*uncached)->tower_runs(), 2u);
  EXPECT_EQ(again_uncached->embeddings, first->embeddings);
}

// A request's images at once (decoded on several threads, the tower one image at a time): each result equals the
// one-at-a-time encode bit for bit, in the request's order, whatever the thread count; a bad item fails alone; a
// repeat inside the request runs the tower once.
TEST(ImageModality, EncodeAllEqualsOneAtATimeInOrderAndFailsItemsAlone) {
  const std::string dir = (data_dir() / "tower-e2e").string();
  const std::vector<std::string> names = {"tiny_rgb.png", "palette_trns.png", "photo.jpg", "rgba_lossless.webp",
                                          "small_rgba.png", "gray_progressive.jpg"};
  std::vector<MediaItem> items;
  for (const std::string& n : names)
    items.push_back({n.ends_with(".png") ? "image/png" : n.ends_with(".jpg") ? "image/jpeg" : "image/webp",
                     testing::read_bytes(data_dir() / "images" / n)});
  auto single = make_image_modality(dir, 32, true, /*cache_mib=*/0);
  ASSERT_TRUE(single.ok()) << single.status().to_string();
  std::vector<MediaEmbedding> expected;
  for (const MediaItem& item : items) {
    auto e = (*single)->encode(item, Stream{});
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    expected.push_back(*e);
  }
  for (unsigned threads : {1u, 3u, 16u}) {
    auto all = make_image_modality(dir, 32, true, /*cache_mib=*/0);
    ASSERT_TRUE(all.ok());
    (*all)->set_host_threads(threads);
    const auto results = (*all)->encode_all(items, Stream{});
    ASSERT_EQ(results.size(), items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      ASSERT_TRUE(results[i].ok()) << names[i] << ": " << results[i].status().to_string();
      EXPECT_EQ(results[i]->tokens, expected[i].tokens) << names[i] << " with " << threads << " threads";
      EXPECT_EQ(results[i]->embeddings, expected[i].embeddings) << names[i] << " with " << threads << " threads";
    }
    EXPECT_EQ((*all)->tower_runs(), items.size());
  }
  // A truncated item between good ones fails alone, with the decoder's message; a repeat runs the tower once.
  std::vector<MediaItem> mixed = {items[0], items[1], items[0]};
  mixed[1].bytes.resize(mixed[1].bytes.size() / 2);
  auto cached = make_image_modality(dir, 32, true, /*cache_mib=*/16);
  ASSERT_TRUE(cached.ok());
  const auto results = (*cached)->encode_all(mixed, Stream{});
  ASSERT_EQ(results.size(), 3u);
  ASSERT_TRUE(results[0].ok() && results[2].ok());
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(results[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(results[0]->embeddings, expected[0].embeddings);
  EXPECT_EQ(results[2]->embeddings, expected[0].embeddings);
  EXPECT_EQ((*cached)->tower_runs(), 1u);
}

TEST(ImageModalityWholeModel, LogitsWithTwoImagesMatchTransformers) {
  load_plugin();
  LoadedModel m = load_e2e_model();
  auto ref = CheckpointTensors::open_file(data_dir() / "tower-e2e/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  auto tensors = CheckpointTensors::open(data_dir() / "tower-e2e");
  ASSERT_TRUE(tensors.ok());
  std::ifstream in(data_dir() / "tower-e2e/config.json");
  const VisionConfig config = *parse_vision_config(nlohmann::json::parse(in));
  auto weights = load_vision_weights(*tensors, config);
  ASSERT_TRUE(weights.ok());

  const StoredTensor* ids_t = ref->find("prompt_ids");
  ASSERT_NE(ids_t, nullptr);
  std::vector<int32_t> prompt((ids_t->end - ids_t->begin) / 4);
  {
    std::ifstream f(ids_t->file, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(ids_t->begin));
    f.read(reinterpret_cast<char*>(prompt.data()), static_cast<std::streamsize>(prompt.size() * 4));
  }
  const int64_t n = static_cast<int64_t>(prompt.size());
  // The images of tools/make_vision_tower_fixtures.py's image_references(): grids (1, 4, 4) and (1, 6, 8), pixels of
  // seed 5101 + 100 + k; each placeholder run in the prompt takes its image's rows.
  const std::vector<std::array<int64_t, 3>> grids = {{1, 4, 4}, {1, 6, 8}};
  std::vector<std::vector<float>> rows;
  std::vector<MediaRows> media;
  int64_t pos = 0;
  for (size_t k = 0; k < grids.size(); ++k) {
    const int64_t patches = grids[k][0] * grids[k][1] * grids[k][2];
    const std::array<std::array<int64_t, 3>, 1> grid = {grids[k]};
    auto r = run_vision_tower(config, *weights, synthetic_pixels(patches, config.patch_dim(), 5201 + k), grid);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    rows.push_back(std::move(r).value());
    while (pos < n && prompt[pos] != config.image_token_id) ++pos;
    ASSERT_EQ(prompt[pos - 1], config.image_start_token_id);
    ASSERT_EQ(prompt[pos + patches / 4], config.image_end_token_id);
    media.push_back(MediaRows{pos, patches / 4, nullptr});
    pos += patches / 4;
  }
  for (size_t k = 0; k < media.size(); ++k) media[k].embeddings = rows[k].data();

  kiln::testing::Glm5NextCache cache(m, 256, 1);
  std::vector<int32_t> table = cache.table(n);
  SequenceStep step{prompt, 0, &table, true, 0, {}};
  step.media = media;
  StepOutput out;
  const Status s = kiln::testing::glm5_next_model(m).forward({&step, 1}, cache.views(), {}, out);
  ASSERT_TRUE(s.ok()) << s.to_string();
  auto want = ref->read("prompt_logits", {n, m.info.vocab_size});
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ASSERT_EQ(out.logits.size(), want->size());
  const double err = kiln::testing::relative_error(out.logits.data(), want->data(), static_cast<int64_t>(want->size()));
  std::printf("tower-e2e: logits with two images (%lld tokens) max|Δ| / max|ref| = %.3g\n", static_cast<long long>(n),
              err);
  EXPECT_LT(err, 1e-4);
  // Without the image rows the logits are another model's: the rows matter.
  SequenceStep plain{prompt, 0, &table, true, 0, {}};
  kiln::testing::Glm5NextCache cache2(m, 256, 1);
  std::vector<int32_t> table2 = cache2.table(n);
  plain.block_table = &table2;
  StepOutput without;
  ASSERT_TRUE(kiln::testing::glm5_next_model(m).forward({&plain, 1}, cache2.views(), {}, without).ok());
  EXPECT_GT(kiln::testing::relative_error(without.logits.data(), want->data(), static_cast<int64_t>(want->size())),
            10 * err);
}

}  // namespace
}  // namespace kiln::vision
