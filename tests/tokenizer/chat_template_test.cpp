#include "tokenizer/chat_template.h"

#include "tokenizer/python_json.h"
#include "tokenizer_test_support.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const Json& messages, const ChatTemplateOptions& options = {}) {
  auto parsed = parse_chat_messages(messages);
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  if (!parsed.ok()) return {};
  auto rendered = render_glm_chat(*parsed, options);
  EXPECT_TRUE(rendered.ok()) << rendered.status().to_string();
  return rendered.ok() ? *rendered : std::string();
}

constexpr const char* kToolsBlockStart =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
constexpr const char* kToolsBlockEnd =
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>"
    "{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";

// Conversations rendered by jinja2 from GLM-4.7's chat_template.jinja (tools/make_tokenizer.py).
TEST(ChatTemplate, MatchesTheJinjaTemplate) {
  const Json cases = testing::read_json("chat_reference.json");
  ASSERT_GE(cases.size(), 10u);
  for (const Json& c : cases) {
    ChatTemplateOptions options;
    options.add_generation_prompt = c["options"].value("add_generation_prompt", true);
    options.enable_thinking = c["options"].value("enable_thinking", true);
    options.clear_thinking = c["options"].value("clear_thinking", true);
    options.tools = c["tools"];
    EXPECT_EQ(render(c["messages"], options), c["expected"].get<std::string>()) << c["name"];
  }
}

TEST(ChatTemplate, SystemAndUser) {
  const Json messages = Json::parse(R"([{"role":"system","content":"Be kind."},{"role":"user","content":"Hi"}])");
  EXPECT_EQ(render(messages), "[gMASK]<sop><|system|>Be kind.<|user|>Hi<|assistant|><think>");
  ChatTemplateOptions off;
  off.enable_thinking = false;
  EXPECT_EQ(render(messages, off), "[gMASK]<sop><|system|>Be kind.<|user|>Hi<|assistant|></think>");
  ChatTemplateOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(render(messages, no_prompt), "[gMASK]<sop><|system|>Be kind.<|user|>Hi");
}

TEST(ChatTemplate, EarlierTurnsLoseTheirReasoning) {
  const Json messages = Json::parse(R"([
    {"role":"user","content":"Q1"},
    {"role":"assistant","content":" A1 ","reasoning_content":"R1"},
    {"role":"user","content":"Q2"},
    {"role":"assistant","content":"A2","reasoning_content":"\n R2 \n"}])");
  ChatTemplateOptions options;
  options.add_generation_prompt = false;
  EXPECT_EQ(render(messages, options),
            "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2");
  options.clear_thinking = false;
  EXPECT_EQ(render(messages, options),
            "[gMASK]<sop><|user|>Q1<|assistant|><think>R1</think>A1<|user|>Q2<|assistant|><think>R2</think>A2");
}

TEST(ChatTemplate, ToolDefinitionsCallsAndResults) {
  ChatTemplateOptions options;
  options.tools = Json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"b":1,"a":[true,null]}}}])");
  const Json messages = Json::parse(R"([
    {"role":"user","content":"go"},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"1","type":"function","function":{"name":"f","arguments":"{\"s\":\"text\",\"n\":2,\"x\":0.5,\"o\":{\"k\":[1,\"v\"]},\"t\":false}"}}]},
    {"role":"tool","tool_call_id":"1","content":"r1"},
    {"role":"tool","tool_call_id":"2","content":"r2"}])");
  const std::string expected =
      std::string("[gMASK]<sop>") + kToolsBlockStart +
      "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"b\": 1, \"a\": [true, null]}}}\n" +
      kToolsBlockEnd +
      "<|user|>go<|assistant|></think><tool_call>f<arg_key>s</arg_key><arg_value>text</arg_value>"
      "<arg_key>n</arg_key><arg_value>2</arg_value><arg_key>x</arg_key><arg_value>0.5</arg_value>"
      "<arg_key>o</arg_key><arg_value>{\"k\": [1, \"v\"]}</arg_value><arg_key>t</arg_key><arg_value>false</arg_value>"
      "</tool_call><|observation|><tool_response>r1</tool_response><tool_response>r2</tool_response>"
      "<|assistant|><think>";
  EXPECT_EQ(render(messages, options), expected);
}

TEST(ChatTemplate, ReasoningInsideContent) {
  const Json messages = Json::parse(R"([
    {"role":"user","content":"Q"},
    {"role":"assistant","content":"<think>\nR\n</think>\n\nA"}])");
  ChatTemplateOptions options;
  options.add_generation_prompt = false;
  EXPECT_EQ(render(messages, options), "[gMASK]<sop><|user|>Q<|assistant|><think>R</think>A");
}

TEST(ChatTemplate, DeveloperIsReadAsSystem) {
  const Json messages = Json::parse(R"([{"role":"developer","content":"D"},{"role":"user","content":"U"}])");
  EXPECT_EQ(render(messages), "[gMASK]<sop><|system|>D<|user|>U<|assistant|><think>");
}

TEST(ChatTemplate, ParseErrorsNameTheField) {
  auto expect_error = [](const char* json, const std::string& field) {
    const auto result = parse_chat_messages(Json::parse(json));
    ASSERT_FALSE(result.ok()) << json;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(result.status().message().find(field), std::string::npos) << result.status().message();
  };
  expect_error(R"({"role":"user"})", "messages");
  expect_error(R"([{"role":"user","content":"a"},{"content":"b"}])", "messages[1].role");
  expect_error(R"([{"role":"user","content":"a"},{"role":"user","content":""},{"role":"wizard","content":"b"}])",
               "messages[2].role");
  // Required fields, as OpenAI's API answers them with a 400.
  expect_error(R"([{"role":"user"}])", "messages[0].content: a user message needs content");
  expect_error(R"([{"role":"user","content":"a"},{"role":"user","content":null}])", "messages[1].content");
  expect_error(R"([{"role":"system","content":null}])", "messages[0].content");
  expect_error(R"([{"role":"assistant","content":null}])", "messages[0].content: an assistant message needs content");
  expect_error(R"([{"role":"tool","content":"42"}])", "messages[0].tool_call_id");
  expect_error(R"([{"role":"tool","tool_call_id":"","content":"42"}])", "messages[0].tool_call_id");
  expect_error(R"([{"role":"tool","tool_call_id":"call_1"}])", "messages[0].content");
  EXPECT_TRUE(parse_chat_messages(Json::parse(
                  R"([{"role":"assistant","content":null,"tool_calls":[{"id":"c","function":{"name":"f"}}]},
                      {"role":"tool","tool_call_id":"c","content":"ok"}])"))
                  .ok());
  expect_error(R"([{"role":"user","content":5}])", "messages[0].content");
  expect_error(R"([{"role":"user","content":[{"type":"image_url","image_url":{}}]}])", "messages[0].content[0]");
  expect_error(R"([{"role":"assistant","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}])",
               "messages[0].content[0]: image parts are accepted in user messages only");
  expect_error(R"([{"role":"user","content":[{"type":"input_audio"}]}])", "messages[0].content[0]");
  expect_error(R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}])",
               "messages[0].tool_calls[0].function.arguments");
  expect_error(R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}])",
               "messages[0].tool_calls[0].function.arguments");
  expect_error(R"([{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}])",
               "messages[0].tool_calls[0].function.name");
}

// Image parts become media pieces where they stood, numbered over the request; the text around them stays client
// text and the template's markup is unchanged.
TEST(ChatTemplate, ImagePartsBecomeMediaPiecesInPlace) {
  auto parsed = parse_chat_messages(Json::parse(R"([
    {"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,QUJD"}},
                              {"type":"text","text":"Compare "},
                              {"type":"image_url","image_url":"data:image/png;base64,QUI="}, "with this."]},
    {"role":"assistant","content":"Done."},
    {"role":"user","content":[{"type":"text","text":"And "},{"type":"image_url","image_url":{"url":"x"}}]}])"));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  ASSERT_EQ((*parsed)[0].media.size(), 2u);
  EXPECT_EQ((*parsed)[0].media[0].offset, 0u);
  EXPECT_EQ((*parsed)[0].media[1].offset, 8u);
  EXPECT_EQ((*parsed)[0].media[1].url, "data:image/png;base64,QUI=");
  EXPECT_EQ((*parsed)[0].media[1].field, "messages[0].content[2]");
  EXPECT_EQ((*parsed)[2].media[0].index, 2);
  auto pieces = render_glm_chat_pieces(*parsed, {});
  ASSERT_TRUE(pieces.ok());
  std::string shape;
  for (const PromptPiece& p : *pieces)
    shape += p.media >= 0 ? "[media " + std::to_string(p.media) + "]" : (p.client_text ? "{" + p.text + "}" : p.text);
  EXPECT_EQ(shape,
            "[gMASK]<sop><|user|>[media 0]{Compare }[media 1]{with this.}<|assistant|></think>{Done.}<|user|>{And }"
            "[media 2]<|assistant|><think>");
}

TEST(ChatTemplate, RenderRejectsUnknownRoles) {
  std::vector<ChatMessage> messages(1);
  messages[0].role = "narrator";
  const auto result = render_glm_chat(messages, {});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("messages[0].role"), std::string::npos);
}

TEST(PythonJson, MatchesPythonJsonDumps) {
  EXPECT_EQ(
      python_json_dumps(Json::parse(R"({"z":1,"a":[1.0,2.5,1e16,1e-5,0.1,-0.0,123456789.125],"s":"é\n\u0001\"\\"})")),
      "{\"z\": 1, \"a\": [1.0, 2.5, 1e+16, 1e-05, 0.1, -0.0, 123456789.125], \"s\": \"é\\n\\u0001\\\"\\\\\"}");
  EXPECT_EQ(python_json_dumps(Json::parse("[true,false,null,{},[]]")), "[true, false, null, {}, []]");
}

}  // namespace
}  // namespace kiln
