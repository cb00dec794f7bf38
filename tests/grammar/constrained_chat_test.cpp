// Constrained decoding end to end: the server over the real engine and the embedded tiny model (models/tiny-glm, a
// 10 M model that writes nonsense), so it is the grammar alone that makes the answers valid. Every answer must parse
// and validate against its schema (nested objects, enums, arrays, required fields, bounded numbers and strings),
// forced tool calls must name a tool and carry schema-valid arguments, bad formats are 400s naming the field, and
// MTP drafting leaves constrained greedy output unchanged, token for token.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
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
namespace {

using nlohmann::json;

const std::filesystem::path kModelDir = std::filesystem::path(KILN_SOURCE_DIR) / "models/tiny-glm";

void load_mtp_plugin() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(std::filesystem::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-draft-mtp.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string() << " (build the kiln-plugin-draft-mtp target)";
}

// A server over tiny-glm; depth > 0 drafts with its MTP layer. fp32 KV: verification and single-token decoding then
// agree to the last bit, so greedy tokens must too.
class TinyServer {
 public:
  explicit TinyServer(int mtp_depth = 0) {
    std::vector<std::string> sets = {"model.path=" + kModelDir.string(),
                                     "kv.layout=fp32",
                                     "kv.block_size=16",
                                     "scheduler.max_model_len=1024",
                                     "scheduler.max_num_seqs=4",
                                     "scheduler.max_num_batched_tokens=256",
                                     "model.threads=1"};
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
  EngineMetrics metrics() const { return engine_.engine->metrics(); }

 private:
  Recipe recipe_;
  LoadedModel model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  StartedEngine engine_;
  std::unique_ptr<HttpServer> server_;
};

json user(const std::string& text) {
  return json::array({{{"role", "user"}, {"content", text}}});
}

json schema_request(const json& schema, const std::string& prompt, double temperature = 0.0, int seed = 0) {
  return {{"messages", user(prompt)},
          {"max_tokens", 400},
          {"temperature", temperature},
          {"seed", seed},
          {"response_format",
           {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", schema}, {"strict", true}}}}}};
}

// Schemas a weak model can finish inside max_tokens: strings and arrays are bounded (xgrammar enforces maxLength,
// maxItems, minimum/maximum), so every path through them ends.
std::vector<json> test_schemas() {
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
std::string content_problem(const json& body, const json& schema) {
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

TEST(ConstrainedChat, JsonSchemaAnswersValidateGreedyAndSampled) {
  TinyServer server;
  const std::vector<std::string> prompts = {"Describe a widget.", "Return a new list of the socket module"};
  for (const json& schema : test_schemas())
    for (const std::string& prompt : prompts) {
      auto [status, body] = server.chat(schema_request(schema, prompt));
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(content_problem(body, schema), "") << schema.dump();
      for (int seed : {1, 2}) {
        auto [s2, sampled] = server.chat(schema_request(schema, prompt, 1.0, seed));
        ASSERT_EQ(s2, 200) << sampled.dump();
        EXPECT_EQ(content_problem(sampled, schema), "") << schema.dump() << " seed " << seed;
      }
    }
}

TEST(ConstrainedChat, JsonObjectIsAnObject) {
  TinyServer server;
  json req = {{"messages", user("Give me a JSON object.")},
              {"max_tokens", 400},
              {"temperature", 0},
              {"response_format", {{"type", "json_object"}}}};
  auto [status, body] = server.chat(req);
  ASSERT_EQ(status, 200) << body.dump();
  const json& choice = body["choices"][0];
  // The tiny model may write a string that outlasts max_tokens; what it wrote must still be a JSON object's prefix,
  // and a finished answer an object.
  const std::string content = choice["message"]["content"];
  ASSERT_FALSE(content.empty());
  EXPECT_EQ(content.find_first_not_of(" \n\t"), content.find('{')) << content;
  if (choice["finish_reason"] == "stop") {
    const json parsed = json::parse(content, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << content;
  }
}

json weather_tools() {
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

// The single tool call of `body`, checked against the tool it names; "" when it is valid.
std::string tool_call_problem(const json& body, const json& tools, const std::string& want_name) {
  if (!body.contains("choices")) return "no choices in " + body.dump();
  const json& choice = body["choices"][0];
  if (choice["finish_reason"] != "tool_calls")
    return "finish_reason " + choice["finish_reason"].dump() + ": " + body.dump();
  const json& calls = choice["message"]["tool_calls"];
  if (!calls.is_array() || calls.size() != 1) return "not one tool call: " + body.dump();
  const std::string name = calls[0]["function"]["name"];
  if (!want_name.empty() && name != want_name) return "called " + name;
  const json args = json::parse(calls[0]["function"]["arguments"].get<std::string>(), nullptr, false);
  if (args.is_discarded()) return "arguments are not JSON: " + calls[0]["function"]["arguments"].dump();
  for (const json& tool : tools)
    if (tool["function"]["name"] == name) {
      const std::string p = schema_problem(args, tool["function"]["parameters"]);
      return p.empty() ? "" : p + " in " + args.dump();
    }
  return "no tool named " + name;
}

TEST(ConstrainedChat, NamedToolChoiceGivesSchemaValidArguments) {
  TinyServer server;
  const json tools = weather_tools();
  for (const std::string name : {"get_weather", "set_alarm"})
    for (double temperature : {0.0, 1.0}) {
      json req = {{"messages", user("What is the weather in Paris?")},
                  {"max_tokens", 200},
                  {"temperature", temperature},
                  {"seed", 7},
                  {"tools", tools},
                  {"tool_choice", {{"type", "function"}, {"function", {{"name", name}}}}}};
      auto [status, body] = server.chat(req);
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(tool_call_problem(body, tools, name), "") << name << " at temperature " << temperature;
    }
}

TEST(ConstrainedChat, RequiredToolChoiceCallsOneOfTheTools) {
  TinyServer server;
  const json tools = weather_tools();
  for (int seed : {0, 1, 2}) {
    json req = {{"messages", user("Wake me at seven.")},
                {"max_tokens", 200},
                {"temperature", seed == 0 ? 0.0 : 1.0},
                {"seed", seed},
                {"tools", tools},
                {"tool_choice", "required"}};
    auto [status, body] = server.chat(req);
    ASSERT_EQ(status, 200) << body.dump();
    EXPECT_EQ(tool_call_problem(body, tools, ""), "") << "seed " << seed;
  }
}

// 400 naming `param`, with `phrase` in the message.
void expect_refused(TinyServer& server, const json& req, const std::string& param, const std::string& phrase) {
  auto [status, body] = server.chat(req);
  EXPECT_EQ(status, 400) << body.dump();
  EXPECT_EQ(body["error"]["param"], param) << body.dump();
  EXPECT_NE(body["error"]["message"].get<std::string>().find(phrase), std::string::npos) << body.dump();
}

TEST(ConstrainedChat, BadFormatsAreRefusedNamingTheField) {
  TinyServer server;
  json base = {{"messages", user("hi")}, {"max_tokens", 8}};
  auto with = [&](json format) {
    json r = base;
    r["response_format"] = std::move(format);
    return r;
  };
  expect_refused(server, with("json"), "response_format", "must be an object");
  expect_refused(server, with({{"type", "yaml"}}), "response_format.type", "yaml");
  expect_refused(server, with({{"schema", json::object()}}), "response_format.type", "required");
  expect_refused(server, with({{"type", "json_schema"}}), "response_format.json_schema", "required");
  expect_refused(server, with({{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}),
                 "response_format.json_schema.schema", "required");
  expect_refused(server, with({{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", "object"}}}}),
                 "response_format.json_schema.schema", "JSON schema");
  expect_refused(server,
                 with({{"type", "json_schema"}, {"json_schema", {{"name", 3}, {"schema", {{"type", "object"}}}}}}),
                 "response_format.json_schema.name", "string");
  expect_refused(
      server, with({{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "object"}}}, {"strict", "yes"}}}}),
      "response_format.json_schema.strict", "boolean");
  // Schemas xgrammar cannot build: an unknown type, a reference to nothing, a minimum above the maximum.
  for (const char* bad : {R"({"type": "objekt"})", R"({"$ref": "#/$defs/missing"})",
                          R"({"type": "integer", "minimum": 5, "maximum": 1})"}) {
    expect_refused(server, with({{"type", "json_schema"}, {"json_schema", {{"schema", json::parse(bad)}}}}),
                   "response_format.json_schema.schema", "cannot be enforced");
  }
  // A forced tool call and a JSON answer at once.
  json both = with({{"type", "json_object"}});
  both["tools"] = weather_tools();
  both["tool_choice"] = "required";
  expect_refused(server, both, "response_format", "tool_choice");
  // A tool whose parameters no grammar can hold.
  json bad_tool = base;
  bad_tool["tools"] = json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}}}])");
  bad_tool["tool_choice"] = "required";
  expect_refused(server, bad_tool, "tools", "cannot be enforced");
  // The server still answers afterwards.
  auto [status, body] = server.chat(base);
  EXPECT_EQ(status, 200) << body.dump();
}

// MTP drafting verifies each draft against the mask of its own position: greedy constrained answers are the same
// tokens with and without drafting, and drafts are proposed and accepted along the way.
TEST(ConstrainedChat, MtpDraftingLeavesConstrainedGreedyOutputUnchanged) {
  std::vector<json> requests;
  for (const json& schema : test_schemas()) requests.push_back(schema_request(schema, "Describe a widget."));
  requests.push_back({{"messages", user("Weather?")},
                      {"max_tokens", 200},
                      {"temperature", 0},
                      {"tools", weather_tools()},
                      {"tool_choice", "required"}});
  requests.push_back({{"messages", user("Alarm")},
                      {"max_tokens", 200},
                      {"temperature", 0},
                      {"tools", weather_tools()},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "set_alarm"}}}}}});
  std::vector<json> plain, drafted;
  {
    TinyServer server;
    for (const json& r : requests) plain.push_back(server.chat(r).second);
  }
  TinyServer server(/*mtp_depth=*/3);
  for (const json& r : requests) drafted.push_back(server.chat(r).second);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(plain[i].contains("choices")) << plain[i].dump();
    ASSERT_TRUE(drafted[i].contains("choices")) << drafted[i].dump();
    // Tool-call ids are random per response: compare what the calls say.
    auto said = [](const json& body) {
      json m = body["choices"][0]["message"];
      for (json& call : m["tool_calls"]) call.erase("id");
      return m;
    };
    EXPECT_EQ(said(plain[i]), said(drafted[i])) << "request " << i;
    EXPECT_EQ(plain[i]["usage"]["completion_tokens"], drafted[i]["usage"]["completion_tokens"]) << "request " << i;
  }
  const EngineMetrics m = server.metrics();
  EXPECT_GT(m.spec_draft_tokens, 0) << "nothing was drafted";
  EXPECT_GT(m.spec_accepted_tokens, 0) << "no draft was accepted";
  // Sampled with drafting (rejection sampling against the masked target): still valid answers every time.
  for (const json& schema : test_schemas())
    for (int seed : {4, 5, 6}) {
      auto [status, body] = server.chat(schema_request(schema, "Describe a widget.", 1.0, seed));
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(content_problem(body, schema), "") << schema.dump() << " seed " << seed;
    }
  json sampled_call = {{"messages", user("Alarm")}, {"max_tokens", 200}, {"temperature", 1.0}, {"seed", 8},
                       {"tools", weather_tools()}, {"tool_choice", "required"}};
  auto [status, body] = server.chat(sampled_call);
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(tool_call_problem(body, weather_tools(), ""), "");
}

}  // namespace
}  // namespace kiln::testing
