// What the constrained-decoding tests share (the CPU ones in tests/grammar, the CUDA ones in tests/gpu): a server
// over the real engine and the embedded tiny model (models/tiny-glm), the schemas it is asked for, and checks of its
// answers against them (schema_check.h, independent of the grammar engine).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_factory.h"
#include "grammar/schema_check.h"
#include "model/model_loader.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace kiln::testing {

using nlohmann::json;

inline const std::filesystem::path kModelDir = std::filesystem::path(KILN_SOURCE_DIR) / "models/tiny-glm";

inline void load_mtp_plugin() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(std::filesystem::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-draft-mtp.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string() << " (build the kiln-plugin-draft-mtp target)";
}

// A server over tiny-glm; depth > 0 drafts with its MTP layer. On the CPU with fp32 KV, on CUDA with bf16 KV: either
// way verification and single-token decoding agree to the last bit (the CUDA runner's decode is batch-invariant), so
// greedy tokens must too.
class TinyServer {
 public:
  // `chat_template_dir`: a checkpoint folder whose chat template replaces tiny-glm's (GLM-4.7's built-in renderer).
  explicit TinyServer(int mtp_depth = 0, bool cuda = false, const std::string& tool_parser = "glm47",
                      const std::filesystem::path& chat_template_dir = {}) {
    std::vector<std::string> sets = {"model.path=" + kModelDir.string(),
                                     cuda ? "kv.layout=bf16" : "kv.layout=fp32",
                                     "kv.block_size=16",
                                     "scheduler.max_model_len=1024",
                                     "scheduler.max_num_seqs=4",
                                     "scheduler.max_num_batched_tokens=256"};
    sets.push_back(cuda ? "model.device=cuda" : "model.threads=1");
    if (mtp_depth > 0) {
      load_mtp_plugin();
      sets.push_back("speculative.method=mtp");
      sets.push_back("speculative.depth=" + std::to_string(mtp_depth));
    }
    auto recipe = load_recipe("", sets, global_registry());
    EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
    recipe_ = std::move(recipe).value();
    auto m = load_model(recipe_, global_registry(), model_load_options(recipe_));
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    auto t = Tokenizer::load(kModelDir / "tokenizer.json");
    EXPECT_TRUE(t.ok());
    tokenizer_ = std::make_unique<Tokenizer>(std::move(t).value());
    auto e = start_engine(model_, recipe_);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e).value();
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_id = kModelDir.string();
    o.served_name = "tiny-glm";
    o.max_model_len = 1024;
    o.tool_parser = tool_parser;
    if (!chat_template_dir.empty()) {
      auto t = JinjaChatTemplate::from_checkpoint(chat_template_dir);
      EXPECT_TRUE(t.ok() && t->has_value()) << chat_template_dir;
      if (t.ok() && t->has_value()) o.chat_template = std::make_shared<const JinjaChatTemplate>(std::move(**t));
    }
    server_ = std::make_unique<HttpServer>(*engine_.engine, *tokenizer_, o);
    EXPECT_TRUE(server_->start().ok());
  }
  ~TinyServer() {
    server_.reset();
    engine_ = {};
  }

  // POSTs a chat completion; returns {status, body}.
  std::pair<int, json> chat(json body) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(120, 0);
    body["model"] = "tiny-glm";
    auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!res) return {0, json()};
    return {res->status, json::parse(res->body, nullptr, false)};
  }
  // POSTs a streamed chat completion; returns {status, the data of each SSE event before [DONE]}.
  std::pair<int, std::vector<json>> chat_stream(json body) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(120, 0);
    body["model"] = "tiny-glm";
    body["stream"] = true;
    auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!res) return {0, {}};
    std::vector<json> events;
    size_t at = 0;
    while ((at = res->body.find("data: ", at)) != std::string::npos) {
      const size_t end = res->body.find("\n\n", at);
      const std::string data = res->body.substr(at + 6, end == std::string::npos ? end : end - at - 6);
      if (data != "[DONE]") events.push_back(json::parse(data, nullptr, false));
      at = end == std::string::npos ? res->body.size() : end;
    }
    return {res->status, events};
  }
  EngineMetrics metrics() const { return engine_.engine->metrics(); }

 private:
  Recipe recipe_;
  LoadedModel model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  StartedEngine engine_;
  std::unique_ptr<HttpServer> server_;
};

inline json user(const std::string& text) {
  return json::array({{{"role", "user"}, {"content", text}}});
}

// Thinking off: the grammar holds from the answer's first token (tiny-glm, left to reason, rarely closes </think>;
// the tests of reasoning before a constrained answer bound it with thinking_token_budget).
inline const json kNoThinking = {{"enable_thinking", false}};

inline json schema_request(const json& schema, const std::string& prompt, double temperature = 0.0, int seed = 0) {
  return {{"messages", user(prompt)},
          {"chat_template_kwargs", kNoThinking},
          {"max_tokens", 400},
          {"temperature", temperature},
          {"seed", seed},
          {"response_format",
           {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", schema}, {"strict", true}}}}}};
}

// Schemas a weak model can finish inside max_tokens: strings and arrays are bounded (xgrammar enforces maxLength,
// maxItems, minimum/maximum), so every path through them ends.
inline std::vector<json> test_schemas() {
  return {
      // Flat, required fields, enum and bounded integer.
      json::parse(R"({"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 12},
          "color": {"type": "string", "enum": ["red", "green", "blue"]},
          "count": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "color", "count"], "additionalProperties": false})"),
      // Nested objects and a boolean.
      json::parse(R"({"type": "object", "properties": {
          "user": {"type": "object", "properties": {
              "id": {"type": "integer", "minimum": 1, "maximum": 1000},
              "admin": {"type": "boolean"},
              "address": {"type": "object", "properties": {
                  "city": {"type": "string", "maxLength": 10},
                  "zip": {"type": "string", "enum": ["10001", "94105"]}},
                "required": ["city", "zip"], "additionalProperties": false}},
            "required": ["id", "admin", "address"], "additionalProperties": false}},
        "required": ["user"], "additionalProperties": false})"),
      // Arrays of enums and of objects.
      json::parse(R"({"type": "object", "properties": {
          "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
          "points": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
              "x": {"type": "integer", "minimum": -5, "maximum": 5},
              "y": {"type": "integer", "minimum": -5, "maximum": 5}},
            "required": ["x", "y"], "additionalProperties": false}}},
        "required": ["tags", "points"], "additionalProperties": false})"),
  };
}

// The answer's content parsed, with its problem against `schema` ("" when valid).
inline std::string content_problem(const json& body, const json& schema) {
  if (!body.contains("choices")) return "no choices in " + body.dump();
  const json& choice = body["choices"][0];
  if (choice["finish_reason"] != "stop") return "finish_reason " + choice["finish_reason"].dump() + ": " + body.dump();
  const json& content = choice["message"]["content"];
  if (!content.is_string()) return "content is not a string: " + body.dump();
  const json parsed = json::parse(content.get<std::string>(), nullptr, false);
  if (parsed.is_discarded()) return "content is not JSON: " + content.get<std::string>();
  const std::string p = schema_problem(parsed, schema);
  return p.empty() ? "" : p + " in " + content.get<std::string>();
}

inline json weather_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
      "parameters": {"type": "object", "properties": {
          "city": {"type": "string", "maxLength": 12},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit", "days"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "set_alarm", "description": "An alarm",
      "parameters": {"type": "object", "properties": {
          "hour": {"type": "integer", "minimum": 0, "maximum": 23},
          "labels": {"type": "array", "items": {"type": "string", "enum": ["work", "home"]}, "maxItems": 2}},
        "required": ["hour", "labels"], "additionalProperties": false}}}])");
}

// Greedy answers to the same requests without and with drafting: the same messages (tool-call ids are random per
// response, so the calls are compared by what they say).
inline void expect_same_messages(const std::vector<json>& plain, const std::vector<json>& drafted) {
  ASSERT_EQ(plain.size(), drafted.size());
  auto said = [](const json& body) {
    json m = body["choices"][0]["message"];
    for (json& call : m["tool_calls"]) call.erase("id");
    return m;
  };
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(plain[i].contains("choices")) << plain[i].dump();
    ASSERT_TRUE(drafted[i].contains("choices")) << drafted[i].dump();
    EXPECT_EQ(said(plain[i]), said(drafted[i])) << "request " << i;
  }
}

// The tool calls of `body` (at least one, at most `max_calls`), each checked against the tool it names (`want_name`
// when set); "" when they are all valid.
inline std::string tool_calls_problem(const json& body, const json& tools, const std::string& want_name,
                                      size_t max_calls) {
  if (!body.contains("choices")) return "no choices in " + body.dump();
  const json& choice = body["choices"][0];
  if (choice["finish_reason"] != "tool_calls")
    return "finish_reason " + choice["finish_reason"].dump() + ": " + body.dump();
  const json& calls = choice["message"]["tool_calls"];
  if (!calls.is_array() || calls.empty() || calls.size() > max_calls)
    return std::to_string(calls.size()) + " tool calls, at most " + std::to_string(max_calls) +
           " wanted: " + body.dump();
  for (const json& call : calls) {
    const std::string name = call["function"]["name"];
    if (!want_name.empty() && name != want_name) return "called " + name;
    const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    if (args.is_discarded()) return "arguments are not JSON: " + call["function"]["arguments"].dump();
    const auto tool =
        std::find_if(tools.begin(), tools.end(), [&](const json& t) { return t["function"]["name"] == name; });
    if (tool == tools.end()) return "no tool named " + name;
    const std::string p = schema_problem(args, (*tool)["function"]["parameters"]);
    if (!p.empty()) return p + " in " + args.dump();
  }
  return "";
}

// The single tool call of `body`, checked against the tool it names; "" when it is valid.
inline std::string tool_call_problem(const json& body, const json& tools, const std::string& want_name) {
  return tool_calls_problem(body, tools, want_name, 1);
}

}  // namespace kiln::testing
