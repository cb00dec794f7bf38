// The text-side parsers on their own: stop strings, the glm45 reasoning split, the glm47 tool-call parser
// (whole and fed one character at a time), and the pipeline from token ids.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/glm_tool_call_parser.h"
#include "server/output_pipeline.h"
#include "server/reasoning_parser.h"
#include "server/stop_string_matcher.h"
#include "server_test_support.h"

namespace kiln {
namespace {

using nlohmann::ordered_json;

std::string text_of(const OutputPieces& pieces, OutputPiece::Kind kind) {
  std::string out;
  for (const auto& p : pieces) {
    if (p.kind == kind) out += p.text;
  }
  return out;
}

TEST(StopStringMatcher, HoldsBackAPossibleStartAndCutsAtTheMatch) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.feed("hello S"), "hello ");
  EXPECT_EQ(m.feed("T"), "");
  EXPECT_EQ(m.feed("OP and more"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.feed("ignored"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStringMatcher, ReleasesHeldTextWhenItIsNotAStop) {
  StopStringMatcher m({"STOP", "##"});
  EXPECT_EQ(m.feed("a ST"), "a ");
  EXPECT_EQ(m.feed("ART #"), "START ");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.flush(), "#");
}

TEST(StopStringMatcher, EarliestOfSeveralStopsWins) {
  StopStringMatcher m({"bb", "a"});
  EXPECT_EQ(m.feed("xxbbya"), "xx");
}

TEST(ReasoningParser, SplitsAtThinkCloseAcrossChunks) {
  ReasoningParser p(/*starts_in_reasoning=*/true);
  OutputPieces all;
  for (std::string chunk : {"Let me th", "ink.</th", "ink>The ans", "wer."}) append_pieces(all, p.feed(chunk));
  append_pieces(all, p.flush());
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kReasoning), "Let me think.");
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kContent), "The answer.");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].kind, OutputPiece::Kind::kReasoning);
}

TEST(ReasoningParser, DropsARepeatedThinkOpenAndKeepsUnfinishedReasoning) {
  ReasoningParser p(true);
  OutputPieces all = p.feed("<think>still thinking");
  append_pieces(all, p.flush());
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kReasoning), "still thinking");
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kContent), "");
}

TEST(ReasoningParser, ThinkingOffIsAllContentUnlessTheAnswerOpensThink) {
  ReasoningParser off(false);
  OutputPieces all = off.feed("plain answer");
  append_pieces(all, off.flush());
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kContent), "plain answer");

  ReasoningParser opened(false);
  all = opened.feed("<thi");
  append_pieces(all, opened.feed("nk>why</think>because"));
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kReasoning), "why");
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kContent), "because");
}

const ordered_json kTools = ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
      "query": {"type": "string"}, "filters": {"type": "object"}}}}}
])");

std::function<std::string()> counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

struct ParsedStream {
  std::string content;
  std::vector<std::string> names, ids;
  std::vector<std::string> arguments;  // concatenated deltas per call
  std::vector<int> argument_deltas;    // how many deltas per call
};

ParsedStream run_parser(GlmToolCallParser& parser, const std::string& text, size_t chunk) {
  ParsedStream s;
  OutputPieces all;
  for (size_t i = 0; i < text.size(); i += chunk) {
    // Each feed's pieces are kept separate, as separate SSE chunks would be.
    for (auto& p : parser.feed(text.substr(i, chunk))) all.push_back(p);
  }
  for (auto& p : parser.flush()) all.push_back(p);
  for (const auto& p : all) {
    if (p.kind == OutputPiece::Kind::kContent) s.content += p.text;
    if (p.kind == OutputPiece::Kind::kToolCallStart) {
      EXPECT_EQ(p.tool_index, static_cast<int>(s.names.size()));
      s.names.push_back(p.tool_name);
      s.ids.push_back(p.tool_id);
      s.arguments.emplace_back();
      s.argument_deltas.push_back(0);
    }
    if (p.kind == OutputPiece::Kind::kToolCallArguments) {
      EXPECT_LT(p.tool_index, static_cast<int>(s.names.size())) << "arguments before the call's name";
      s.arguments[p.tool_index] += p.text;
      s.argument_deltas[p.tool_index]++;
    }
  }
  return s;
}

const std::string kTwoCalls =
    "I will look.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris \"Left\" Bank</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>\n<tool_call>search\n<arg_key>query</arg_key>\n"
    "<arg_value>ünïcode</arg_value>\n<arg_key>filters</arg_key>\n<arg_value>{\"year\": 2024, \"tags\": [\"a\"]}"
    "</arg_value>\n</tool_call>";

TEST(GlmToolCallParser, ParsesSeveralCallsWithStringAndJsonArguments) {
  GlmToolCallParser parser(kTools, counter_ids());
  ParsedStream s = run_parser(parser, kTwoCalls, kTwoCalls.size());
  EXPECT_EQ(s.content, "I will look.\n");
  ASSERT_EQ(s.names, (std::vector<std::string>{"get_weather", "search"}));
  EXPECT_EQ(s.ids, (std::vector<std::string>{"call_0", "call_1"}));
  EXPECT_EQ(ordered_json::parse(s.arguments[0]), ordered_json::parse(R"({"city": "Paris \"Left\" Bank", "days": 3})"));
  EXPECT_EQ(ordered_json::parse(s.arguments[1]),
            ordered_json::parse(R"({"query": "ünïcode", "filters": {"year": 2024, "tags": ["a"]}})"));
  ASSERT_EQ(parser.calls().size(), 2u);
  EXPECT_TRUE(parser.calls()[1].complete);
  EXPECT_EQ(parser.calls()[0].arguments, s.arguments[0]);
}

TEST(GlmToolCallParser, OneCharacterAtATimeGivesTheSameCallsIncrementally) {
  GlmToolCallParser whole(kTools, counter_ids());
  ParsedStream expected = run_parser(whole, kTwoCalls, kTwoCalls.size());
  GlmToolCallParser parser(kTools, counter_ids());
  ParsedStream s = run_parser(parser, kTwoCalls, 1);
  EXPECT_EQ(s.content, expected.content);
  EXPECT_EQ(s.names, expected.names);
  EXPECT_EQ(s.arguments, expected.arguments);
  // The string value streams character by character: many deltas, not one per argument.
  EXPECT_GT(s.argument_deltas[0], 10);
}

TEST(GlmToolCallParser, CallWithoutArgumentsAndUnknownSchemaValues) {
  ordered_json no_schema = ordered_json::parse(R"([{"type": "function", "function": {"name": "ping"}}])");
  GlmToolCallParser parser(no_schema, counter_ids());
  ParsedStream s = run_parser(
      parser,
      "<tool_call>ping</tool_call><tool_call>ping<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>w"
      "</arg_key><arg_value>hello world</arg_value><arg_key>b</arg_key><arg_value>true</arg_value></tool_call>",
      3);
  ASSERT_EQ(s.arguments.size(), 2u);
  EXPECT_EQ(s.arguments[0], "{}");
  EXPECT_EQ(ordered_json::parse(s.arguments[1]), ordered_json::parse(R"({"n": 7, "w": "hello world", "b": true})"));
}

TEST(GlmToolCallParser, SchemaStringKeepsNumericLookingText) {
  GlmToolCallParser parser(kTools, counter_ids());
  ParsedStream s =
      run_parser(parser, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>1984</arg_value></tool_call>", 5);
  EXPECT_EQ(ordered_json::parse(s.arguments[0])["city"], "1984");
}

TEST(GlmToolCallParser, WhitespaceAroundAStringValueIsLayoutInAnyChunking) {
  // What a grammar in xgrammar's glm_xml style allows: whitespace between <arg_value> and the value, and after it.
  const std::string text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>\n  New  York \n\t</arg_value>"
                           "<arg_key>days</arg_key><arg_value> 2\n</arg_value></tool_call>";
  for (size_t chunk : {text.size(), size_t{1}, size_t{3}}) {
    GlmToolCallParser parser(kTools, counter_ids());
    ParsedStream s = run_parser(parser, text, chunk);
    ASSERT_EQ(s.arguments.size(), 1u) << chunk;
    EXPECT_EQ(ordered_json::parse(s.arguments[0]), ordered_json::parse(R"({"city": "New  York", "days": 2})"))
        << "chunks of " << chunk << ": " << s.arguments[0];
  }
}

TEST(GlmToolCallParser, TextThatOnlyLooksLikeATagStaysContent) {
  GlmToolCallParser parser(kTools, counter_ids());
  ParsedStream s = run_parser(parser, "a <tool b <tool_cal", 2);
  EXPECT_EQ(s.content, "a <tool b <tool_cal");
  EXPECT_TRUE(s.names.empty());
}

TEST(GlmToolCallParser, CallCutOffBeforeItsNameIsReturnedAsContent) {
  GlmToolCallParser parser(kTools, counter_ids());
  ParsedStream s = run_parser(parser, "x<tool_call>get_wea", 4);
  EXPECT_EQ(s.content, "x<tool_call>get_wea");
  EXPECT_TRUE(parser.calls().empty());
}

TEST(GlmToolCallParser, ACallOpenedByThePromptStartsAtOnce) {
  GlmToolCallParser parser(kTools, counter_ids());
  OutputPieces start = parser.begin_call("get_weather");
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0].kind, OutputPiece::Kind::kToolCallStart);
  EXPECT_EQ(start[0].tool_name, "get_weather");
  const std::string rest = "<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>";
  for (size_t i = 0; i < rest.size(); i += 4) {
    for (const auto& p : parser.feed(rest.substr(i, 4))) EXPECT_EQ(p.kind, OutputPiece::Kind::kToolCallArguments);
  }
  EXPECT_EQ(parser.calls()[0].arguments, R"({"city": "Rome"})");
  EXPECT_TRUE(parser.calls()[0].complete);

  GlmToolCallParser empty(kTools, counter_ids());
  empty.begin_call("get_weather");
  empty.feed("</tool_call>");
  EXPECT_EQ(empty.calls()[0].arguments, "{}");
}

TEST(OutputPipeline, TokensThroughStopReasoningAndTools) {
  using testing::server_test_tokenizer;
  OutputPipelineOptions o;
  o.split_reasoning = true;
  o.starts_in_reasoning = true;
  o.tool_parser = "glm47";
  o.tools = kTools;
  o.stop_token_ids = {*server_test_tokenizer().token_to_id("<|user|>")};
  OutputPipeline pipeline(server_test_tokenizer(), o);
  OutputPieces all;
  for (int32_t id : testing::reply_tokens(
           "Need weather.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
           "</tool_call>")) {
    append_pieces(all, pipeline.feed_token(id));
  }
  append_pieces(all, pipeline.finish());
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kReasoning), "Need weather.");
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kContent), "Checking.");
  ASSERT_EQ(pipeline.tool_calls().size(), 1u);
  EXPECT_EQ(pipeline.tool_calls()[0].name, "get_weather");
  EXPECT_EQ(pipeline.tool_calls()[0].arguments, R"({"city": "Oslo"})");
}

TEST(OutputPipeline, StopStringSpanningTokensEndsTheText) {
  using testing::server_test_tokenizer;
  OutputPipelineOptions o;
  o.stop_strings = {"world peace"};
  OutputPipeline pipeline(server_test_tokenizer(), o);
  auto ids = server_test_tokenizer().encode("hello world peace forever");
  ASSERT_GT(server_test_tokenizer().encode("world peace").size(), 1u) << "the stop string must span tokens";
  OutputPieces all;
  for (int32_t id : ids) append_pieces(all, pipeline.feed_token(id));
  append_pieces(all, pipeline.finish());
  EXPECT_TRUE(pipeline.stopped_by_string());
  EXPECT_EQ(text_of(all, OutputPiece::Kind::kContent), "hello ");
}

// skip_special_tokens (vLLM's default, true): special tokens produce no text but <think> / </think> (for the
// reasoning split, or as marks without it); with tools offered every marker stays (for the parser, or in the text
// without one); false keeps them all.
TEST(OutputPipeline, SpecialTokensNoParserReadsAreLeftOutUnlessAskedFor) {
  using testing::server_test_tokenizer;
  const std::string reply = "<think>Plan.</think>An<|begin_of_image|>swer<|endoftext|>.";
  auto run = [&](bool skip, bool reasoning, bool tools, const std::string& parser = "glm47") {
    OutputPipelineOptions o;
    o.skip_special_tokens = skip;
    o.split_reasoning = reasoning;
    if (tools) {
      o.tool_parser = parser;
      o.tools = kTools;
    }
    o.stop_token_ids = {*server_test_tokenizer().token_to_id("<|user|>")};
    OutputPipeline pipeline(server_test_tokenizer(), o);
    OutputPieces all;
    for (int32_t id : testing::reply_tokens(reply)) append_pieces(all, pipeline.feed_token(id));
    append_pieces(all, pipeline.finish());
    return std::make_pair(text_of(all, OutputPiece::Kind::kReasoning), text_of(all, OutputPiece::Kind::kContent));
  };
  ASSERT_TRUE(server_test_tokenizer().is_special(*server_test_tokenizer().token_to_id("<|begin_of_image|>")));
  EXPECT_EQ(run(true, false, false), std::make_pair(std::string(), std::string("<think>Plan.</think>Answer.")));
  EXPECT_EQ(run(true, true, false), std::make_pair(std::string("Plan."), std::string("Answer.")));
  EXPECT_EQ(run(false, false, false), std::make_pair(std::string(), reply));
  EXPECT_EQ(run(false, true, false),
            std::make_pair(std::string("Plan."), std::string("An<|begin_of_image|>swer<|endoftext|>.")));
  // A tool-call parser reads special tokens: nothing is skipped while one runs, nor while tools are offered with
  // no parser (the calls stay in the text).
  EXPECT_EQ(run(true, true, true), run(false, true, true));
  EXPECT_EQ(run(true, false, true, ""), std::make_pair(std::string(), reply));

  // A call still parses with the default.
  OutputPipelineOptions o;
  o.tool_parser = "glm47";
  o.tools = kTools;
  OutputPipeline pipeline(server_test_tokenizer(), o);
  for (int32_t id : testing::reply_tokens("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
                                          "</tool_call>"))
    (void)pipeline.feed_token(id);
  (void)pipeline.finish();
  ASSERT_EQ(pipeline.tool_calls().size(), 1u);
  EXPECT_EQ(pipeline.tool_calls()[0].arguments, R"({"city": "Oslo"})");
}

}  // namespace
}  // namespace kiln
