#include "server/tool_call_parser.h"

#include "server/deepseek_v3_tool_call_parser.h"
#include "server/glm_tool_call_parser.h"

namespace kiln {

bool is_tool_parser(const std::string& name) {
  return name == "glm47" || name == "deepseek_v3";
}

std::unique_ptr<ToolCallParser> make_tool_call_parser(const std::string& name, const nlohmann::ordered_json& tools,
                                                      std::function<std::string()> make_id) {
  if (name == "glm47") return std::make_unique<GlmToolCallParser>(tools, std::move(make_id));
  if (name == "deepseek_v3") return std::make_unique<DeepSeekV3ToolCallParser>(tools, std::move(make_id));
  return nullptr;
}

std::vector<PromptPiece> forced_call_opening(const std::string& parser, const std::string& name) {
  if (parser == "deepseek_v3") {
    using P = DeepSeekV3ToolCallParser;
    // "required" opens the section only: the grammar writes each call whole, so several can follow.
    if (name.empty()) return {{P::kCallsBegin, false}};
    return {{P::kCallsBegin + P::kCallBegin + "function" + P::kSep, false}, {name, true}, {P::kArgumentsOpen, false}};
  }
  if (name.empty()) return {{"<tool_call>", false}};
  return {{"<tool_call>", false}, {name, true}};
}

}  // namespace kiln
