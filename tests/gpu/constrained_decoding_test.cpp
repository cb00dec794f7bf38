// Constrained decoding on the CUDA runner: the engine's token masks are uploaded with the step's selection and
// applied to the logits on the device (kernels/cuda/token_mask), so greedy, sampled and verified selection all keep
// to the grammar. The tiny model writes nonsense: the grammar alone makes its answers valid. Drafting stays lossless.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar/constrained_support.h"

namespace kiln::testing {
namespace {

TEST(CudaConstrainedChat, JsonSchemaAnswersValidateGreedyAndSampled) {
  TinyServer server(/*mtp_depth=*/0, /*cuda=*/true);
  for (const json& schema : test_schemas())
    for (int seed : {0, 1, 2}) {
      auto [status, body] = server.chat(schema_request(schema, "Describe a widget.", seed == 0 ? 0.0 : 1.0, seed));
      ASSERT_EQ(status, 200) << body.dump();
      EXPECT_EQ(content_problem(body, schema), "") << schema.dump() << " seed " << seed;
    }
}

TEST(CudaConstrainedChat, ForcedToolCallsCarrySchemaValidArguments) {
  TinyServer server(0, true);
  const json tools = weather_tools();
  for (const std::string name : {"get_weather", "set_alarm"}) {
    json req = {{"messages", user("What is the weather in Paris?")},
                {"chat_template_kwargs", kNoThinking},
                {"max_tokens", 200},
                {"temperature", 0},
                {"tools", tools},
                {"tool_choice", {{"type", "function"}, {"function", {{"name", name}}}}}};
    auto [status, body] = server.chat(req);
    ASSERT_EQ(status, 200) << body.dump();
    EXPECT_EQ(tool_call_problem(body, tools, name), "") << name;
  }
  json req = {{"messages", user("Wake me at seven.")},
              {"chat_template_kwargs", kNoThinking},
              {"max_tokens", 200},
              {"temperature", 1.0},
              {"seed", 3},
              {"tools", tools},
              {"tool_choice", "required"},
              {"parallel_tool_calls", false}};
  auto [status, body] = server.chat(req);
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(tool_call_problem(body, tools, ""), "");
}

// Each verified draft is tested against the mask of its own position: the same tokens with and without drafting.
TEST(CudaConstrainedChat, MtpDraftingLeavesConstrainedGreedyOutputUnchanged) {
  std::vector<json> requests;
  for (const json& schema : test_schemas()) requests.push_back(schema_request(schema, "Describe a widget."));
  requests.push_back({{"messages", user("Alarm")},
                      {"chat_template_kwargs", kNoThinking},
                      {"max_tokens", 200},
                      {"temperature", 0},
                      {"tools", weather_tools()},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "set_alarm"}}}}}});
  std::vector<json> plain, drafted;
  {
    TinyServer server(0, true);
    for (const json& r : requests) plain.push_back(server.chat(r).second);
  }
  TinyServer server(/*mtp_depth=*/3, /*cuda=*/true);
  for (const json& r : requests) drafted.push_back(server.chat(r).second);
  expect_same_messages(plain, drafted);
  if (HasFatalFailure()) return;
  const EngineMetrics m = server.metrics();
  EXPECT_GT(m.spec_accepted_tokens, 0) << "no draft was accepted";
}

}  // namespace
}  // namespace kiln::testing
