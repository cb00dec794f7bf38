// The server over the real engine and the embedded tiny model (models/tiny-glm): concurrent streaming clients
// get exactly the tokens of sequential runs, and clients that disconnect mid-stream leave no KV blocks behind.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
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

// n > 1: each choice is a sequence of its own with seed + i. Choice i of a seeded request equals the n = 1 request
// with seed + i, so choices differ and are reproducible; greedy choices are identical; usage counts the prompt once
// and every choice's tokens; the stream carries every index, one usage chunk and one [DONE]; no blocks are left.
TEST_F(RealEngineServer, ChoicesAreSequencesOfTheirOwnWithSeedPlusIndex) {
  httplib::Client c("127.0.0.1", server_->port());
  c.set_read_timeout(60, 0);
  auto post = [&](const char* path, nlohmann::json body) {
    auto res = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    return nlohmann::json::parse(res->body);
  };
  const nlohmann::json base = {{"prompt", "The socket module provides"}, {"max_tokens", 12}, {"temperature", 1.0},
                               {"seed", 1234}};
  nlohmann::json three = base;
  three["n"] = 3;
  const auto many = post("/v1/completions", three);
  ASSERT_EQ(many["choices"].size(), 3u);
  int64_t completion_tokens = 0;
  std::set<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(many["choices"][i]["index"], i);
    nlohmann::json one = base;
    one["seed"] = 1234 + i;
    const auto single = post("/v1/completions", one);
    EXPECT_EQ(many["choices"][i]["text"], single["choices"][0]["text"]) << "choice " << i;
    completion_tokens += single["usage"]["completion_tokens"].get<int64_t>();
    texts.insert(many["choices"][i]["text"].get<std::string>());
    if (i == 0) EXPECT_EQ(many["usage"]["prompt_tokens"], single["usage"]["prompt_tokens"]);
  }
  EXPECT_GT(texts.size(), 1u) << "seeded choices should differ";
  EXPECT_EQ(many["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(many["usage"]["total_tokens"],
            many["usage"]["prompt_tokens"].get<int64_t>() + many["usage"]["completion_tokens"].get<int64_t>());

  // Greedy chat choices are identical and end the same way.
  const nlohmann::json chat = {{"messages", nlohmann::json::array({{{"role", "user"}, {"content", "Return a new list"}}})},
                               {"max_tokens", 10}, {"temperature", 0}, {"n", 2}};
  const auto greedy = post("/v1/chat/completions", chat);
  ASSERT_EQ(greedy["choices"].size(), 2u);
  EXPECT_EQ(greedy["choices"][0]["message"], greedy["choices"][1]["message"]);
  EXPECT_EQ(greedy["choices"][1]["index"], 1);

  // Streamed: the same text per index as the body, every index's finish chunk, usage once, [DONE] once.
  nlohmann::json streamed = chat;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  auto res = c.Post("/v1/chat/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::string text[2];
  int finishes[2] = {0, 0}, usage_chunks = 0, done = 0;
  for (const auto& e : parse_sse(res->body)) {
    if (e.data == "[DONE]") {
      ++done;
      continue;
    }
    const auto j = nlohmann::json::parse(e.data);
    if (!j["usage"].is_null()) {
      ++usage_chunks;
      EXPECT_EQ(j["usage"]["completion_tokens"], greedy["usage"]["completion_tokens"]);
    }
    for (const auto& ch : j["choices"]) {
      const int i = ch["index"];
      ASSERT_TRUE(i == 0 || i == 1);
      if (ch["delta"].contains("content")) text[i] += ch["delta"]["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) ++finishes[i];
    }
  }
  EXPECT_EQ(done, 1);
  EXPECT_EQ(usage_chunks, 1);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(finishes[i], 1) << "choice " << i;
    EXPECT_EQ(text[i], greedy["choices"][i]["message"]["content"].get<std::string>()) << "choice " << i;
  }
  EXPECT_EQ(wait_idle().kv_blocks_used, 0);

  // Out of range, and on the Responses API: 400s naming n.
  nlohmann::json too_many = base;
  too_many["n"] = 17;
  auto bad = c.Post("/v1/completions", too_many.dump(), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("\"n\""), std::string::npos) << bad->body;
  auto responses = c.Post("/v1/responses", nlohmann::json{{"input", "hi"}, {"n", 2}}.dump(), "application/json");
  ASSERT_TRUE(responses);
  EXPECT_EQ(responses->status, 400);
  EXPECT_NE(responses->body.find("\"n\""), std::string::npos) << responses->body;
}

}  // namespace
}  // namespace kiln::testing
