// Image parts through the server: data: URLs decoded (base64 by libcrypto), the recipe's modality called for each,
// its tokens spliced into the prompt where the part stood and its rows handed to the engine with the item's content
// hash, so the same image shares prefix-cache blocks and another does not. Client mistakes are 400s naming the part:
// a remote URL, bad base64, a type the modality does not take (the built-in `text` takes none), too many images, an
// image outside a user message.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <nlohmann/json.hpp>

#include "engine/engine_factory.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "server/media_input.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace kiln::testing {
namespace {

using Json = nlohmann::json;

// "image/x-test" items: <|begin_of_image|> (markup-free stand-in: token 10) + one placeholder per 3 bytes (token 11)
// + an end token (12); each placeholder's row is a pattern of its bytes, so different bytes give different rows.
class StripesModality final : public Modality {
 public:
  explicit StripesModality(int64_t hidden) : hidden_(hidden) {}
  std::vector<std::string> accepted_mime_types() const override { return {"image/x-test"}; }
  Result<MediaEmbedding> encode(const MediaItem& item, Stream) override {
    ++calls;
    if (item.bytes.size() < 3) return invalid_argument("the image is smaller than one 3-byte pixel");
    MediaEmbedding e;
    const int64_t n = static_cast<int64_t>(item.bytes.size() / 3);
    e.tokens.push_back(10);
    for (int64_t i = 0; i < n; ++i) e.tokens.push_back(11);
    e.tokens.push_back(12);
    e.first_placeholder = 1;
    e.num_embeddings = n;
    e.embeddings.resize(n * hidden_);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < hidden_; ++d)
        e.embeddings[i * hidden_ + d] = (item.bytes[i * 3 + d % 3] - 128) / 64.0f * ((d % 7) - 3) / 3.0f;
    return e;
  }
  int calls = 0;

 private:
  int64_t hidden_;
};

std::string data_url(const std::string& mime, const std::string& base64) { return "data:" + mime + ";base64," + base64; }

// Twelve bytes each: four placeholders.
const std::string kImageA = "AAECAwQFBgcICQoL";  // 00..0b
const std::string kImageB = "8PHy8/T19vf4+fr7";  // f0..fb

TEST(MediaInputUnit, DataUrlsDecodeWithTheirPadding) {
  MediaItem item;
  ASSERT_FALSE(decode_data_url(data_url("image/png", "QUJD"), "f", item).has_value());
  EXPECT_EQ(item.mime_type, "image/png");
  EXPECT_EQ(std::string(item.bytes.begin(), item.bytes.end()), "ABC");
  ASSERT_FALSE(decode_data_url(data_url("image/png", "QUI="), "f", item).has_value());
  EXPECT_EQ(std::string(item.bytes.begin(), item.bytes.end()), "AB");
  ASSERT_FALSE(decode_data_url(data_url("image/png", "QQ=="), "f", item).has_value());
  EXPECT_EQ(std::string(item.bytes.begin(), item.bytes.end()), "A");
  auto remote = decode_data_url("https://example.com/cat.png", "messages[0].content[1]", item);
  ASSERT_TRUE(remote.has_value());
  EXPECT_EQ(remote->http_status, 400);
  EXPECT_EQ(remote->param, "messages[0].content[1].image_url.url");
  EXPECT_NE(remote->message.find("only data: URLs"), std::string::npos);
  EXPECT_TRUE(decode_data_url(data_url("image/png", "!!!!"), "f", item).has_value());
  EXPECT_TRUE(decode_data_url(data_url("image/png", "QUJ"), "f", item).has_value());
  EXPECT_TRUE(decode_data_url("data:image/png,QUJD", "f", item).has_value());
}

TEST(MediaInputUnit, TheContentHashCoversTypeAndBytes) {
  MediaItem a{"image/png", {1, 2, 3}}, b{"image/png", {1, 2, 4}}, c{"image/jpeg", {1, 2, 3}};
  EXPECT_EQ(media_content_hash(a), media_content_hash(MediaItem{"image/png", {1, 2, 3}}));
  EXPECT_NE(media_content_hash(a), media_content_hash(b));
  EXPECT_NE(media_content_hash(a), media_content_hash(c));
  EXPECT_NE(media_content_hash(a), 0u);
}

class MediaServer : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto dir = std::filesystem::path(KILN_SOURCE_DIR) / "models/tiny-glm";
    auto recipe = load_recipe("", {"model.path=" + dir.string(), "kv.layout=fp32", "kv.block_size=4",
                                   "scheduler.max_model_len=256", "scheduler.max_num_seqs=4",
                                   "scheduler.max_num_batched_tokens=256", "model.threads=1"},
                              global_registry());
    ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
    recipe_ = std::move(recipe).value();
    auto m = load_model(recipe_, global_registry());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    auto t = Tokenizer::load(dir / "tokenizer.json");
    ASSERT_TRUE(t.ok());
    tokenizer_ = std::make_unique<Tokenizer>(std::move(t).value());
    auto e = start_engine(model_, recipe_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e).value();
    stripes_ = std::make_shared<StripesModality>(model_.info.hidden_size);
  }
  void TearDown() override {
    server_.reset();
    engine_ = {};
  }
  // With the test modality, or (text = true) the engine's own: the recipe's built-in `text`.
  void serve(bool text = false, int64_t max_images = 2, RemoteMediaOptions remote = {}) {
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_id = "tiny-glm";
    o.max_model_len = 256;
    o.media.modality = text ? engine_.modality : stripes_;
    o.media.modality_name = text ? "text" : "stripes";
    o.media.max_images = max_images;
    o.media.hidden_size = model_.info.hidden_size;
    o.media.remote = remote;
    server_ = std::make_unique<HttpServer>(*engine_.engine, *tokenizer_, o);
    ASSERT_TRUE(server_->start().ok());
  }
  Json post(const std::string& path, const Json& body, int& status) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    status = r ? r->status : -1;
    return r ? Json::parse(r->body, nullptr, false) : Json();
  }
  static Json chat(const std::vector<Json>& parts, const std::string& role = "user") {
    return {{"model", "tiny-glm"}, {"max_tokens", 8}, {"temperature", 0},
            {"messages", Json::array({{{"role", role}, {"content", parts}}})}};
  }
  static Json text(const std::string& t) { return {{"type", "text"}, {"text", t}}; }
  static Json image(const std::string& url) { return {{"type", "image_url"}, {"image_url", {{"url", url}}}}; }

  Recipe recipe_;
  LoadedModel model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  StartedEngine engine_;
  std::shared_ptr<StripesModality> stripes_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(MediaServer, AnImageBecomesItsModalitysTokensAndTheSameImageReusesTheCache) {
  serve();
  int status = 0;
  const Json a = chat({text("Describe this: "), image(data_url("image/x-test", kImageA)), text(" and then stop.")});
  const Json first = post("/v1/chat/completions", a, status);
  ASSERT_EQ(status, 200) << first.dump();
  EXPECT_EQ(stripes_->calls, 1);
  // The text on each side of the part tokenized as it stands, and the item's tokens (begin + 4 placeholders + end)
  // between them.
  const std::vector<PromptPiece> before = {{"[gMASK]<sop><|user|>", false}, {"Describe this: ", true}};
  const std::vector<PromptPiece> after = {{" and then stop.", true}, {"<|assistant|><think>", false}};
  const int before_image = static_cast<int>(tokenizer_->encode(before).size());
  EXPECT_EQ(first["usage"]["prompt_tokens"].get<int>(),
            before_image + 6 + static_cast<int>(tokenizer_->encode(after).size()));
  const Json again = post("/v1/chat/completions", a, status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(again["choices"][0]["message"], first["choices"][0]["message"]);
  const int prompt_tokens = first["usage"]["prompt_tokens"].get<int>();
  // Every full block of the prompt but the last computed one comes from the cache, the image's blocks included.
  EXPECT_GE(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), (prompt_tokens - 1) / 4 * 4 - 4);
  // Another image behind the same tokens: only the blocks before the image are shared.
  const Json b = chat({text("Describe this: "), image(data_url("image/x-test", kImageB)), text(" and then stop.")});
  const Json other = post("/v1/chat/completions", b, status);
  ASSERT_EQ(status, 200);
  EXPECT_LE(other["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), before_image);
}

TEST_F(MediaServer, TheResponsesApiTakesInputImages) {
  serve();
  int status = 0;
  Json body = {{"model", "tiny-glm"}, {"max_output_tokens", 8}, {"temperature", 0},
               {"input", Json::array({{{"role", "user"},
                                       {"content", Json::array({{{"type", "input_text"}, {"text", "Look: "}},
                                                                {{"type", "input_image"},
                                                                 {"image_url", data_url("image/x-test", kImageA)}}})}}})}};
  const Json r = post("/v1/responses", body, status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(stripes_->calls, 1);
}

TEST_F(MediaServer, TheBuiltInTextModalityRefusesImagesNamingThePart) {
  serve(/*text=*/true);
  int status = 0;
  const Json r = post("/v1/chat/completions", chat({text("What is this?"), image(data_url("image/png", "QUJD"))}), status);
  EXPECT_EQ(status, 400) << r.dump();
  EXPECT_EQ(r["error"]["param"], "messages[0].content[1]");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("modality `text`"), std::string::npos) << r.dump();
}

TEST_F(MediaServer, ClientMistakesAre400sNamingThePart) {
  serve(/*text=*/false, /*max_images=*/1);
  int status = 0;
  auto message = [&](const Json& body) {
    const Json r = post("/v1/chat/completions", body, status);
    EXPECT_EQ(status, 400) << r.dump();
    return r.contains("error") ? r["error"]["message"].get<std::string>() : std::string();
  };
  EXPECT_NE(message(chat({image("http://example.com/cat.png")})).find("only data: URLs"), std::string::npos);
  EXPECT_NE(message(chat({image(data_url("image/x-test", "@@@@"))})).find("not valid base64"), std::string::npos);
  EXPECT_NE(message(chat({image(data_url("image/gif", kImageA))})).find("image/x-test"), std::string::npos);
  EXPECT_NE(message(chat({image(data_url("image/x-test", "QQ=="))})).find("smaller than one 3-byte pixel"),
            std::string::npos);
  EXPECT_NE(message(chat({image(data_url("image/x-test", kImageA)), image(data_url("image/x-test", kImageB))}))
                .find("media.max_images"),
            std::string::npos);
  EXPECT_NE(message(chat({image(data_url("image/x-test", kImageA))}, "system")).find("user messages only"),
            std::string::npos);
  EXPECT_EQ(stripes_->calls, 1);  // only the undersized image reached the modality
  // The server still serves.
  const Json ok = post("/v1/chat/completions", chat({text("Hello")}), status);
  EXPECT_EQ(status, 200) << ok.dump();
}

// http(s) image URLs with media.remote_urls on, against a local image host: fetched (and through a redirect) into
// the same prompt as the data: URL of the same bytes; a missing image, one over media.remote_max_mib, one slower than
// media.remote_timeout_s and a sniffed type the modality does not take are 400s naming the part. Off (the default,
// the test above) they are refused unfetched.
TEST_F(MediaServer, RemoteUrlsAreFetchedWhenTheRecipeAllowsThem) {
  MediaItem a;
  ASSERT_FALSE(decode_data_url(data_url("image/x-test", kImageA), "a", a).has_value());
  const std::string bytes_a(a.bytes.begin(), a.bytes.end());
  httplib::Server host;
  host.Get("/a.test", [&](const httplib::Request&, httplib::Response& r) { r.set_content(bytes_a, "image/x-test"); });
  host.Get("/moved", [](const httplib::Request&, httplib::Response& r) { r.set_redirect("/a.test"); });
  host.Get("/big", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(std::string((1 << 20) + 3, 'x'), "image/x-test");
  });
  host.Get("/slow", [&](const httplib::Request&, httplib::Response& r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    r.set_content(bytes_a, "image/x-test");
  });
  host.Get("/untyped", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(std::string("\x89PNG\r\n\x1a\n0000", 12), "application/octet-stream");
  });
  const int port = host.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread runner([&] { host.listen_after_bind(); });
  const std::string base = "http://127.0.0.1:" + std::to_string(port);

  RemoteMediaOptions remote;
  remote.enabled = true, remote.max_bytes = 1 << 20, remote.timeout_ms = 1000;
  serve(/*text=*/false, /*max_images=*/2, remote);
  int status = 0;
  const Json inline_reply = post("/v1/chat/completions", chat({image(data_url("image/x-test", kImageA))}), status);
  ASSERT_EQ(status, 200) << inline_reply.dump();
  for (const char* path : {"/a.test", "/moved"}) {
    const Json r = post("/v1/chat/completions", chat({image(base + path)}), status);
    ASSERT_EQ(status, 200) << path << ": " << r.dump();
    EXPECT_EQ(r["usage"]["prompt_tokens"], inline_reply["usage"]["prompt_tokens"]) << path;
    EXPECT_EQ(r["choices"][0]["message"]["content"], inline_reply["choices"][0]["message"]["content"]) << path;
  }
  auto refused = [&](const std::string& path, const std::string& says,
                     const std::string& param = "messages[0].content[0].image_url.url") {
    const Json r = post("/v1/chat/completions", chat({image(base + path)}), status);
    EXPECT_EQ(status, 400) << path << ": " << r.dump();
    const std::string message = r.contains("error") ? r["error"]["message"].get<std::string>() : "";
    EXPECT_NE(message.find(says), std::string::npos) << path << ": " << message;
    EXPECT_EQ(r["error"]["param"], param) << path;
  };
  refused("/missing", "HTTP 404");
  refused("/big", "larger than 1 MiB (media.remote_max_mib)");
  refused("/slow", "took longer than 1 s (media.remote_timeout_s)");
  refused("/untyped", "image/png is not a type", "messages[0].content[0]");  // fetched, sniffed, then refused
  // The server still serves.
  post("/v1/chat/completions", chat({image(base + "/a.test")}), status);
  EXPECT_EQ(status, 200);
  host.stop();
  runner.join();
}

}  // namespace
}  // namespace kiln::testing
