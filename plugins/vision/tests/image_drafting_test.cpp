// Requests with images stay lossless under speculative decoding: glm5_next with its next-n (MTP) layer drafting at
// depths 1–3 gives the same greedy tokens for a prompt holding an image as without drafting. The drafter sees what
// it supports — the placeholders' token embeddings, not the image rows — so only its acceptance can suffer; the
// target verifies every draft with the image rows in place.
//
// The checkpoint is put together here: tests/data/models/glm5_next-mtp-plain (trunk + next-n layer) and the tower of
// tests/data/tower-e2e (out_hidden_size 32, the trunk's width), as two shards of one model.safetensors.index.json.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "engine/engine_factory.h"
#include "engine/single_request.h"
#include "image_modality.h"
#include "model/safetensors_writer.h"
#include "plugin/plugin_loader.h"
#include "vision_test_support.h"

namespace kiln::vision {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The combined folder; its tower tensors rewritten as F32 (the shard holds only them).
fs::path build_checkpoint() {
  const fs::path dir = fs::temp_directory_path() / ("kiln-vision-mtp-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path text_dir = kiln::testing::model_dir("glm5_next-mtp-plain"),
                 tower_dir = testing::data_dir() / "tower-e2e";
  Json config = Json::parse(std::ifstream(text_dir / "config.json"));
  const Json tower_config = Json::parse(std::ifstream(tower_dir / "config.json"));
  config["vision_config"] = tower_config["vision_config"];
  for (const char* key : {"image_start_token_id", "image_end_token_id", "image_token_id", "video_start_token_id",
                          "video_end_token_id", "video_token_id"})
    config[key] = tower_config[key];
  std::ofstream(dir / "config.json") << config.dump(2);
  fs::copy_file(text_dir / "model.safetensors", dir / "text.safetensors");

  Json map = Json::object();
  auto text = CheckpointTensors::open_file(dir / "text.safetensors");
  EXPECT_TRUE(text.ok());
  for (const auto& [name, t] : text->tensors()) map[name] = "text.safetensors";
  auto tower = CheckpointTensors::open(tower_dir);
  EXPECT_TRUE(tower.ok());
  std::vector<kiln::testing::TensorSpec> specs;
  for (const auto& [name, t] : tower->tensors()) {
    if (name.rfind("model.visual.", 0) != 0) continue;
    auto values = tower->read(name, t.shape);
    EXPECT_TRUE(values.ok());
    kiln::testing::TensorSpec spec;
    spec.name = name;
    spec.dtype = "F32";
    spec.shape = t.shape;
    spec.bytes = kiln::testing::raw_bytes(values.value());
    specs.push_back(std::move(spec));
    map[name] = "vision.safetensors";
  }
  kiln::testing::write_file(dir / "vision.safetensors", kiln::testing::build_safetensors(specs));
  std::ofstream(dir / "model.safetensors.index.json") << Json{{"metadata", Json::object()}, {"weight_map", map}}.dump();
  return dir;
}

std::vector<std::string> sets(const fs::path& dir, const std::string& method, int depth) {
  return {"model.path=" + dir.string(),
          "model.device=cpu",
          "model.threads=1",
          "kv.layout=fp32",
          "kv.block_size=16",
          "scheduler.max_model_len=512",
          "scheduler.max_num_seqs=2",
          "speculative.method=" + method,
          "speculative.depth=" + std::to_string(depth)};
}

TEST(ImageDrafting, GreedyOutputWithAnImageIsUnchangedByMtpDrafting) {
  static const Status mtp = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-draft-mtp.so");
  }();
  ASSERT_TRUE(mtp.ok()) << mtp.to_string();
  const fs::path dir = build_checkpoint();
  auto modality = make_image_modality(dir.string(), 32, true);
  ASSERT_TRUE(modality.ok()) << modality.status().to_string();
  auto image = (*modality)->encode(
      MediaItem{"image/png", testing::read_bytes(testing::data_dir() / "images/tiny_rgb.png")}, Stream{});
  ASSERT_TRUE(image.ok()) << image.status().to_string();

  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(1 + (i * 37) % 470);
  RequestMedia span;
  span.position = static_cast<int64_t>(prompt.size());
  span.length = static_cast<int64_t>(image->tokens.size());
  span.first_placeholder = image->first_placeholder;
  span.num_embeddings = image->num_embeddings;
  span.embeddings = image->embeddings;
  span.hash = 0x51ab;
  prompt.insert(prompt.end(), image->tokens.begin(), image->tokens.end());
  for (int i = 0; i < 12; ++i) prompt.push_back(1 + (i * 91) % 470);

  auto recipe = load_recipe("", sets(dir, "mtp", 3), global_registry());
  ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), model_load_options(*recipe));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_GE(m->model->num_mtp_layers(), 1);
  auto run = [&](const std::string& method, int depth, EngineMetrics* metrics,
                 bool with_image = true) -> Result<std::vector<int32_t>> {
    KILN_ASSIGN_OR_RETURN(Recipe r, load_recipe("", sets(dir, method, depth), global_registry()));
    KILN_ASSIGN_OR_RETURN(StartedEngine e, start_engine(*m, r));
    RequestParams p;
    p.prompt = prompt;
    if (with_image) p.media = {span};
    p.max_tokens = 24;
    auto out = run_single_request(*e.engine, std::move(p));
    if (metrics) *metrics = e.engine->metrics();
    return out;
  };
  auto plain = run("none", 0, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  // The rows matter: with the placeholders' own embeddings instead, the answer is another.
  auto blind = run("none", 0, nullptr, /*with_image=*/false);
  ASSERT_TRUE(blind.ok());
  EXPECT_NE(*blind, *plain);
  for (int depth = 1; depth <= 3; ++depth) {
    SCOPED_TRACE("depth " + std::to_string(depth));
    EngineMetrics metrics;
    auto drafted = run("mtp", depth, &metrics);
    ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
    EXPECT_EQ(*drafted, *plain);
    EXPECT_GT(metrics.spec_draft_tokens, 0);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::vision
