// The server over the real engine and the embedded tiny model (models/tiny-glm): concurrent streaming clients
// get exactly the tokens of sequential runs, and clients that disconnect mid-stream leave no KV blocks behind.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "engine/engine_factory.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "server/server.h"
#include "server_test_support.h"
#include "tokenizer/tokenizer.h"

namespace kiln::testing {
namespace {

class RealEngineServer : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto dir = std::filesystem::path(KILN_SOURCE_DIR) / "models/tiny-glm";
    // fp32 KV: batched and single-sequence numerics agree to the last bit, so greedy tokens must too.
    auto recipe = load_recipe("", {"model.path=" + dir.string(), "kv.layout=fp32", "kv.block_size=16",
                                   "scheduler.max_model_len=512", "scheduler.max_num_seqs=8",
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
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_id = dir.string();
    o.served_name = "tiny-glm";
    o.max_model_len = 512;
    server_ = std::make_unique<HttpServer>(*engine_.engine, *tokenizer_, o);
    ASSERT_TRUE(server_->start().ok());
  }
  void TearDown() override {
    server_.reset();
    engine_ = {};
  }

  // Streams a greedy completion and returns its text.
  std::string stream_completion(const std::string& prompt, int max_tokens, int drop_after_chunks = -1) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    nlohmann::json body = {{"model", "tiny-glm"}, {"prompt", prompt}, {"max_tokens", max_tokens},
                           {"temperature", 0}, {"stream", true}};
    std::string raw;
    int chunks = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      raw.append(d, n);
      return drop_after_chunks < 0 || ++chunks < drop_after_chunks;
    };
    c.send(req);
    std::string text;
    for (const auto& e : parse_sse(raw)) {
      if (e.data == "[DONE]") continue;
      auto j = nlohmann::json::parse(e.data, nullptr, false);
      if (!j.is_discarded() && j.contains("choices") && !j["choices"].empty()) text += j["choices"][0].value("text", "");
    }
    return text;
  }

  EngineMetrics wait_idle() {
    EngineMetrics m;
    for (int i = 0; i < 500; ++i) {
      m = engine_.engine->metrics();
      if (m.requests_running == 0 && m.requests_waiting == 0 && m.kv_blocks_used == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return m;
  }

  Recipe recipe_;
  LoadedModel model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  StartedEngine engine_;
  std::unique_ptr<HttpServer> server_;
};

const std::vector<std::string> kPrompts = {"The socket module provides", "Return a new list",     "This module implements",
                                           "Raise an exception if",      "The default value is",  "Create a new thread",
                                           "Read the file and",          "If the argument is"};

TEST_F(RealEngineServer, EightConcurrentStreamsMatchSequentialRuns) {
  std::vector<std::string> sequential;
  for (const auto& p : kPrompts) sequential.push_back(stream_completion(p, 24));
  std::vector<std::string> concurrent(kPrompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < kPrompts.size(); ++i)
    clients.emplace_back([&, i] { concurrent[i] = stream_completion(kPrompts[i], 24); });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_FALSE(sequential[i].empty()) << kPrompts[i];
    EXPECT_EQ(concurrent[i], sequential[i]) << kPrompts[i];
  }
  EXPECT_EQ(wait_idle().kv_blocks_used, 0);
}

TEST_F(RealEngineServer, DisconnectingClientsLeaveNoBlocks) {
  std::vector<std::thread> clients;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < kPrompts.size(); ++i)
      clients.emplace_back([&, i] { stream_completion(kPrompts[i], 200, /*drop_after_chunks=*/2 + static_cast<int>(i)); });
    for (auto& t : clients) t.join();
    clients.clear();
  }
  const EngineMetrics m = wait_idle();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_running, 0);
  // The server still answers after the disconnects.
  EXPECT_FALSE(stream_completion("Return a new list", 8).empty());
}

// Logprobs come from the logits row that selected each token: greedy picks the most likely token, so each chosen
// token is its own top alternative with the same log-probability; streamed and whole answers agree.
TEST_F(RealEngineServer, LogprobsOfGreedyTokensAreTheirRowsMaximum) {
  httplib::Client c("127.0.0.1", server_->port());
  c.set_read_timeout(60, 0);
  const nlohmann::json body = {{"messages", nlohmann::json::array({{{"role", "user"}, {"content", "Return a new list"}}})},
                               {"max_tokens", 12}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}};
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto j = nlohmann::json::parse(res->body);
  const auto& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(static_cast<int64_t>(content.size()), j["usage"]["completion_tokens"].get<int64_t>()) << res->body;
  std::vector<double> whole;
  for (const auto& t : content) {
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);
    EXPECT_FLOAT_EQ(t["top_logprobs"][0]["logprob"].get<float>(), t["logprob"].get<float>());
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
    whole.push_back(t["logprob"].get<double>());
  }

  nlohmann::json streamed_body = body;
  streamed_body["stream"] = true;
  std::string raw;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = streamed_body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    raw.append(d, n);
    return true;
  };
  ASSERT_TRUE(c.send(req));
  std::vector<double> streamed;
  for (const auto& e : parse_sse(raw)) {
    if (e.data == "[DONE]") continue;
    const auto chunk = nlohmann::json::parse(e.data);
    if (chunk["choices"].empty() || chunk["choices"][0]["logprobs"].is_null()) continue;
    for (const auto& t : chunk["choices"][0]["logprobs"]["content"]) streamed.push_back(t["logprob"].get<double>());
  }
  EXPECT_EQ(streamed, whole);

  // Completions: logprobs as an integer, OpenAI's legacy shape.
  auto cres = c.Post("/v1/completions",
                     nlohmann::json({{"prompt", "Return a new list"}, {"max_tokens", 6}, {"temperature", 0},
                                     {"logprobs", 2}})
                         .dump(),
                     "application/json");
  ASSERT_TRUE(cres);
  ASSERT_EQ(cres->status, 200) << cres->body;
  const auto lp = nlohmann::json::parse(cres->body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
  ASSERT_EQ(lp["top_logprobs"].size(), lp["tokens"].size());
  ASSERT_FALSE(lp["tokens"].empty()) << cres->body;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
  }
  EXPECT_EQ(lp["text_offset"][0], 0);
}


// On the CPU engine the penalties apply: a +100 logit_bias on one token makes greedy output that token only, a -100
// bias on the token greedy output starts with removes it, and a strong frequency penalty stops a token from
// repeating when greedy output would.
TEST_F(RealEngineServer, LogitBiasAndPenaltiesChangeGreedyOutput) {
  httplib::Client c("127.0.0.1", server_->port());
  c.set_read_timeout(60, 0);
  auto completion = [&](nlohmann::json extra) {
    nlohmann::json body = {{"prompt", "The socket module provides"}, {"max_tokens", 8}, {"temperature", 0}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    return nlohmann::json::parse(res->body);
  };
  const int32_t forced = 300;
  const auto forced_json = completion({{"logit_bias", {{std::to_string(forced), 100}}}, {"logprobs", 0}});
  const auto& tokens = forced_json["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 8u);
  for (size_t i = 1; i < tokens.size(); ++i) EXPECT_EQ(tokens[i], tokens[0]);
  const auto plain = completion({{"logprobs", 0}});
  const std::string first = plain["choices"][0]["logprobs"]["tokens"][0];
  EXPECT_NE(first, tokens[0].get<std::string>());
  const auto repeated = completion({{"logit_bias", {{std::to_string(forced), 100}}}, {"frequency_penalty", 2},
                                    {"repetition_penalty", 100}, {"logprobs", 0}});
  const auto& rt = repeated["choices"][0]["logprobs"]["tokens"];
  // The bias still wins the first pick; after it the repetition penalty (÷100) and the frequency penalty pull it down.
  ASSERT_GE(rt.size(), 2u);
  EXPECT_EQ(rt[0], tokens[0]);
  EXPECT_NE(rt[1], tokens[0]);
}

}  // namespace
}  // namespace kiln::testing
