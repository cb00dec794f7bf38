// The deepseek_v3 tool-call parser on its own: the chat template's format (tests/data/chat_templates/deepseek_v3),
// calls read alike whole and fed in chunks of any size, arguments passed on verbatim as a JSON object string, a
// call opened by the prompt, and malformed or cut-off markup passed on as content, never lost and never a call.
#include "server/deepseek_v3_tool_call_parser.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fake_engine.h"
#include "server/output_pipeline.h"
#include "server/server.h"
#include "server_test_support.h"

namespace kiln {
namespace {

using P = DeepSeekV3ToolCallParser;

std::string call(const std::string& name, const std::string& arguments) {
  return P::kCallBegin + "function" + P::kSep + name + "\n```json\n" + arguments + "\n```" + P::kCallEnd;
}

struct Read {
  std::string content;
  std::vector<std::string> names, arguments;  // arguments: the concatenated deltas of each call
};

Read run(const std::string& text, size_t chunk, const std::string& opened_name = "") {
  auto n = std::make_shared<int>(0);
  DeepSeekV3ToolCallParser parser(nlohmann::ordered_json::array(), [n] { return "call_" + std::to_string((*n)++); });
  OutputPieces all;
  if (!opened_name.empty()) append_pieces(all, parser.begin_call(opened_name));
  for (size_t i = 0; i < text.size(); i += chunk) append_pieces(all, parser.feed(text.substr(i, chunk)));
  append_pieces(all, parser.flush());
  Read r;
  for (const OutputPiece& p : all) {
    if (p.kind == OutputPiece::Kind::kContent) r.content += p.text;
    if (p.kind == OutputPiece::Kind::kToolCallStart) {
      EXPECT_EQ(p.tool_index, static_cast<int>(r.names.size()));
      EXPECT_EQ(p.tool_id, "call_" + std::to_string(r.names.size()));
      r.names.push_back(p.tool_name);
      r.arguments.emplace_back();
    }
    if (p.kind == OutputPiece::Kind::kToolCallArguments) {
      EXPECT_LT(p.tool_index, static_cast<int>(r.names.size())) << "arguments before the call's name";
      r.arguments[p.tool_index] += p.text;
    }
  }
  // The parser's record agrees with what was streamed.
  EXPECT_EQ(parser.calls().size(), r.names.size());
  for (size_t i = 0; i < parser.calls().size() && i < r.names.size(); ++i) {
    EXPECT_EQ(parser.calls()[i].arguments, r.arguments[i]);
    EXPECT_TRUE(parser.calls()[i].complete);
  }
  return r;
}

const std::string kWeatherArgs = R"({"city": "Zürich \"old\" town", "days": 3, "tags": ["a", {"b": null}]})";

TEST(DeepSeekV3ToolCallParser, ReadsTheTemplatesCallsAlikeInAnyChunking) {
  // As the checkpoint's template writes them: text, then the section, calls back to back.
  const std::string text = "Let me check." + P::kCallsBegin + call("get_weather", kWeatherArgs) +
                           call("search", R"({"query": "rain"})") + P::kCallsEnd;
  for (size_t chunk : {text.size(), size_t{1}, size_t{2}, size_t{5}, size_t{13}}) {
    const Read r = run(text, chunk);
    EXPECT_EQ(r.content, "Let me check.") << "chunk " << chunk;
    ASSERT_EQ(r.names, (std::vector<std::string>{"get_weather", "search"})) << "chunk " << chunk;
    EXPECT_EQ(r.arguments[0], kWeatherArgs);  // verbatim: the model's key order and spelling
    EXPECT_EQ(nlohmann::json::parse(r.arguments[1]), nlohmann::json::parse(R"({"query": "rain"})"));
  }
}

TEST(DeepSeekV3ToolCallParser, NewlinesBetweenCallsAndAroundTheSectionAreLayout) {
  const std::string text = P::kCallsBegin + call("a", "{}") + "\n" + call("b", R"({"x": 1})") + "\n" + P::kCallsEnd;
  const Read r = run(text, 3);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.arguments, (std::vector<std::string>{"{}", R"({"x": 1})"}));
}

TEST(DeepSeekV3ToolCallParser, ACallOpenedByThePromptContinuesWithItsArguments) {
  const Read r = run(R"({"city": "Rome"})"
                     "\n```" +
                         P::kCallEnd + P::kCallsEnd,
                     4, "get_weather");
  ASSERT_EQ(r.names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(r.arguments[0], R"({"city": "Rome"})");
  EXPECT_EQ(r.content, "");
}

TEST(DeepSeekV3ToolCallParser, MalformedCallsAreContentWithTheirMarkup) {
  const std::vector<std::string> malformed = {
      call("f", "{not json"),                                                       // arguments that do not parse
      call("f", "[1, 2]"),                                                          // JSON, but not an object
      call("", "{}"),                                                               // no name
      P::kCallBegin + "retrieval" + P::kSep + "f\n```json\n{}\n```" + P::kCallEnd,  // not a function
      P::kCallBegin + "function f {}" + P::kCallEnd,                                // no separator
  };
  for (const std::string& bad : malformed) {
    for (size_t chunk : {size_t{1}, bad.size() + 20}) {
      const Read r = run(P::kCallsBegin + bad + call("ok", "{}") + P::kCallsEnd + "after", chunk);
      EXPECT_EQ(r.content, bad + "after") << bad;
      EXPECT_EQ(r.names, std::vector<std::string>{"ok"}) << bad;  // the good call after it still counts
    }
  }
}

TEST(DeepSeekV3ToolCallParser, CutOffOrBrokenCallsAreContent) {
  // max_tokens ends the answer inside a call: what was generated is returned, nothing is a call.
  const std::string cut = P::kCallBegin + "function" + P::kSep + "f\n```json\n{\"a\": ";
  Read r = run(P::kCallsBegin + cut, 2);
  EXPECT_EQ(r.content, cut);
  EXPECT_TRUE(r.names.empty());
  // A partial marker at the very end is held back until flush, then returned too.
  r = run("Answer <｜tool▁cal", 1);
  EXPECT_EQ(r.content, "Answer <｜tool▁cal");
  // A call broken off by the next one, or by the section's end.
  const std::string broken = P::kCallBegin + "function" + P::kSep + "f\n";
  r = run(P::kCallsBegin + broken + call("g", "{}") + broken + P::kCallsEnd, 3);
  EXPECT_EQ(r.content, broken + broken);
  EXPECT_EQ(r.names, std::vector<std::string>{"g"});
  // Stray text inside the section.
  r = run(P::kCallsBegin + "oops" + call("g", "{}") + P::kCallsEnd, 1);
  EXPECT_EQ(r.content, "oops");
  EXPECT_EQ(r.names, std::vector<std::string>{"g"});
  // Markup that is only similar stays text, and a call without its section is text.
  r = run("<｜tool▁calls▁begin| x " + call("g", "{}"), 4);
  EXPECT_EQ(r.content, "<｜tool▁calls▁begin| x " + call("g", "{}"));
}

TEST(DeepSeekV3ToolCallParser, TheServerPicksItByName) {
  EXPECT_TRUE(is_tool_parser("deepseek_v3"));
  EXPECT_TRUE(is_tool_parser("glm47"));
  EXPECT_FALSE(is_tool_parser("hermes"));
  EXPECT_EQ(make_tool_call_parser("hermes", nlohmann::ordered_json::array(), [] { return std::string(); }), nullptr);
  // The prompt's opening of a forced call: the name is client text.
  const auto named = forced_call_opening("deepseek_v3", "f");
  ASSERT_EQ(named.size(), 3u);
  EXPECT_TRUE(named[1].client_text);
  EXPECT_EQ(named[0].text + named[1].text + named[2].text,
            P::kCallsBegin + P::kCallBegin + "function" + P::kSep + "f\n```json\n");
  EXPECT_EQ(forced_call_opening("deepseek_v3", "").size(), 1u);

  // The server takes it; an unknown parser is refused at start, naming the key and the known parsers.
  for (const char* parser : {"deepseek_v3", "hermes"}) {
    testing::FakeEngine engine;
    HttpServerOptions options;
    options.port = 0;
    options.max_model_len = 512;
    options.tool_parser = parser;
    HttpServer server(engine, testing::server_test_tokenizer(), options);
    const Status s = server.start();
    if (std::string(parser) == "deepseek_v3") {
      EXPECT_TRUE(s.ok()) << s.to_string();
    } else {
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.message().find("server.tool_parser"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find("deepseek_v3"), std::string::npos) << s.message();
    }
  }
}

// The recipe default "auto": each family gets the parsers for what it writes; explicit values stay as given.
TEST(DeepSeekV3ToolCallParser, AutoPicksTheParsersOfTheCheckpointsFamily) {
  EXPECT_EQ(resolve_tool_parser("auto", "deepseek_v3"), "deepseek_v3");
  EXPECT_EQ(resolve_reasoning_parser("auto", "deepseek_v3"), "");  // V3 does not think
  for (const char* glm : {"glm4_moe_lite", "glm_moe_dsa", "glm5_next"}) {
    EXPECT_EQ(resolve_tool_parser("auto", glm), "glm47") << glm;
    EXPECT_EQ(resolve_reasoning_parser("auto", glm), "glm45") << glm;
  }
  EXPECT_EQ(resolve_tool_parser("auto", "llama"), "");  // no parser kiln knows: calls stay in the text
  EXPECT_EQ(resolve_tool_parser("glm47", "deepseek_v3"), "glm47");
  EXPECT_EQ(resolve_reasoning_parser("none", "glm_moe_dsa"), "none");
}

TEST(DeepSeekV3ToolCallParser, ThroughTheOutputPipelineWithAForcedName) {
  OutputPipelineOptions o;
  o.tool_parser = "deepseek_v3";
  o.forced_tool_name = "get_weather";
  OutputPipeline pipeline(testing::server_test_tokenizer(), o);
  OutputPieces all = pipeline.start(forced_call_opening("deepseek_v3", "get_weather")[0].text);
  for (int32_t id : testing::server_test_tokenizer().encode(R"({"city": "Oslo"})"
                                                            "\n```" +
                                                            P::kCallEnd))
    append_pieces(all, pipeline.feed_token(id));
  append_pieces(all, pipeline.finish());
  ASSERT_EQ(pipeline.tool_calls().size(), 1u);
  EXPECT_EQ(pipeline.tool_calls()[0].name, "get_weather");
  EXPECT_EQ(pipeline.tool_calls()[0].arguments, R"({"city": "Oslo"})");
}

}  // namespace
}  // namespace kiln
