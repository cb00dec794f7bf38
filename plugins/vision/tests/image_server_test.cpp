// Images through the server end to end on the CPU: a recipe selecting `media.modality = "image"` on the tiny
// glm5_next-with-vision checkpoint (tests/data/tower-e2e), a PNG sent as a data: URL in chat completions, the
// image's begin marker + placeholders + end marker counted in usage; `media.max_images` and corrupt images refused
// with 400s naming the part; the Responses API's input_image parts take the same path.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/engine_factory.h"
#include "image_modality.h"
#include "model/model_loader.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "vision_test_support.h"

namespace kiln::vision {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::data_dir;

std::string base64(const std::vector<uint8_t>& bytes) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = (uint32_t{bytes[i]} << 16) | (i + 1 < bytes.size() ? uint32_t{bytes[i + 1]} << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t{bytes[i + 2]} : 0);
    out += digits[(n >> 18) & 63];
    out += digits[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? digits[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? digits[n & 63] : '=';
  }
  return out;
}

std::string png_url(const std::string& name) {
  return "data:image/png;base64," + base64(testing::read_bytes(data_dir() / "images" / name));
}

class ImageServer : public ::testing::Test {
 protected:
  void SetUp() override {
    static const Status loaded = [] {
      PluginLoader loader(global_registry());
      return loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-vision.so");
    }();
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    const fs::path dir = data_dir() / "tower-e2e";
    auto recipe =
        load_recipe("",
                    {"model.path=" + dir.string(), "model.device=cpu", "kv.layout=fp32", "kv.block_size=16",
                     "scheduler.max_model_len=512", "scheduler.max_num_seqs=2", "scheduler.max_num_batched_tokens=512",
                     "model.threads=1", "media.modality=image", "media.max_images=2"},
                    global_registry());
    ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
    recipe_ = std::move(recipe).value();
    auto m = load_model(recipe_, global_registry());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    adjust_model(model_);
    auto t = Tokenizer::load(dir / "tokenizer.json");
    ASSERT_TRUE(t.ok());
    tokenizer_ = std::make_unique<Tokenizer>(std::move(t).value());
    auto e = start_engine(model_, recipe_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e).value();
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_id = "tiny-vision";
    o.max_model_len = 512;
    o.media.modality = engine_.modality;
    o.media.modality_name = "image";
    o.media.max_images = recipe_.section("media").get_int("max_images");
    o.media.hidden_size = model_.info.hidden_size;
    server_ = std::make_unique<HttpServer>(*engine_.engine, *tokenizer_, o);
    ASSERT_TRUE(server_->start().ok());
  }
  void TearDown() override {
    server_.reset();
    engine_ = {};
  }
  Json post(const Json& body, int& status) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    status = r ? r->status : -1;
    return r ? Json::parse(r->body, nullptr, false) : Json();
  }
  static Json chat(const std::vector<Json>& parts) {
    return {{"model", "tiny-vision"},
            {"max_tokens", 4},
            {"temperature", 0},
            {"messages", Json::array({{{"role", "user"}, {"content", parts}}})}};
  }
  static Json text(const std::string& t) { return {{"type", "text"}, {"text", t}}; }
  static Json image(const std::string& url) { return {{"type", "image_url"}, {"image_url", {{"url", url}}}}; }
  // Before the engine (and its modality) starts.
  virtual void adjust_model(LoadedModel&) {}

  Recipe recipe_;
  LoadedModel model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  StartedEngine engine_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(ImageServer, APngInChatCompletionsIsAnsweredAndItsTokensCounted) {
  int status = 0;
  const Json with = post(chat({text("What is this? "), image(png_url("tiny_rgb.png"))}), status);
  ASSERT_EQ(status, 200) << with.dump();
  EXPECT_FALSE(with["choices"][0]["message"]["content"].is_null());
  const Json without = post(chat({text("What is this? ")}), status);
  ASSERT_EQ(status, 200) << without.dump();
  // tiny_rgb.png (13×9) is scaled up to a 140×112 canvas, grid 8×10: 20 merged tokens (+ begin and end markers).
  EXPECT_EQ(with["usage"]["prompt_tokens"].get<int>() - without["usage"]["prompt_tokens"].get<int>(), 20 + 2)
      << with["usage"].dump() << " vs " << without["usage"].dump();
  // Two images fit media.max_images = 2.
  const Json two =
      post(chat({image(png_url("tiny_rgb.png")), text("and"), image(png_url("palette_trns.png"))}), status);
  EXPECT_EQ(status, 200) << two.dump();
}

TEST_F(ImageServer, TheResponsesApiTakesAnInputImage) {
  httplib::Client c("127.0.0.1", server_->port());
  c.set_read_timeout(120, 0);
  const Json body = {
      {"model", "tiny-vision"},
      {"max_output_tokens", 4},
      {"temperature", 0},
      {"input",
       Json::array({{{"role", "user"},
                     {"content", Json::array({{{"type", "input_text"}, {"text", "Look: "}},
                                              {{"type", "input_image"}, {"image_url", png_url("tiny_rgb.png")}}})}}})}};
  auto r = c.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const Json j = Json::parse(r->body, nullptr, false);
  EXPECT_GE(j["usage"]["input_tokens"].get<int>(), 20 + 2) << r->body;
}

TEST_F(ImageServer, TooManyImagesAndCorruptImagesAre400sNamingThePart) {
  int status = 0;
  const std::string url = png_url("tiny_rgb.png");
  const Json three = post(chat({image(url), image(url), text("x"), image(url)}), status);
  EXPECT_EQ(status, 400) << three.dump();
  EXPECT_EQ(three["error"]["param"], "messages[0].content[3]") << three.dump();
  EXPECT_NE(three["error"]["message"].get<std::string>().find("media.max_images"), std::string::npos);

  std::vector<uint8_t> png = testing::read_bytes(data_dir() / "images/tiny_rgb.png");
  png.resize(png.size() - 40);
  const Json corrupt = post(chat({text("look"), image("data:image/png;base64," + base64(png))}), status);
  EXPECT_EQ(status, 400) << corrupt.dump();
  EXPECT_EQ(corrupt["error"]["param"], "messages[0].content[1]") << corrupt.dump();
  EXPECT_EQ(corrupt["error"]["message"].get<std::string>().rfind("messages[0].content[1]: ", 0), 0u) << corrupt.dump();

  const Json gif = post(chat({image("data:image/gif;base64,R0lGODlhAQABAAAAACw=")}), status);
  EXPECT_EQ(status, 400) << gif.dump();
  EXPECT_NE(gif["error"]["message"].get<std::string>().find("image/png"), std::string::npos) << gif.dump();
  // The server still serves.
  post(chat({text("Hello"), image(url)}), status);
  EXPECT_EQ(status, 200);
}

// The modality as a dummy recipe makes it (model.load = "dummy" → ModelInfo::synthetic_weights): the CPU cannot load a
// dummy text model (its random weights are made on the GPU), so the tiny checkpoint's text model is served with the
// flag set as the loader sets it; the tower is then random_vision_weights(vision_config, seed), and a request with an
// image is answered end to end with the same prompt tokens as with the checkpoint's tower.
class DummyTowerImageServer : public ImageServer {
 protected:
  void adjust_model(LoadedModel& m) override {
    m.info.synthetic_weights = true;
    m.info.weight_seed = 1;
  }
};

TEST_F(DummyTowerImageServer, APngIsAnsweredByTheRandomTower) {
  int status = 0;
  const Json with = post(chat({text("What is this? "), image(png_url("tiny_rgb.png"))}), status);
  ASSERT_EQ(status, 200) << with.dump();
  const Json without = post(chat({text("What is this? ")}), status);
  ASSERT_EQ(status, 200) << without.dump();
  EXPECT_EQ(with["usage"]["prompt_tokens"].get<int>() - without["usage"]["prompt_tokens"].get<int>(), 20 + 2)
      << with["usage"].dump() << " vs " << without["usage"].dump();
  // The engine's modality is the random tower, not the checkpoint's.
  const MediaItem item{"image/png", testing::read_bytes(data_dir() / "images/tiny_rgb.png")};
  auto served = engine_.modality->encode(item, Stream{});
  ASSERT_TRUE(served.ok()) << served.status().to_string();
  auto random = make_image_modality((data_dir() / "tower-e2e").string(), 32, true, 0, -1, uint64_t{1});
  auto stored = make_image_modality((data_dir() / "tower-e2e").string(), 32, true);
  ASSERT_TRUE(random.ok() && stored.ok());
  EXPECT_EQ(served->embeddings, (*random)->encode(item, Stream{})->embeddings);
  EXPECT_NE(served->embeddings, (*stored)->encode(item, Stream{})->embeddings);
}

}  // namespace
}  // namespace kiln::vision
