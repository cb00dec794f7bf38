#include "server/tool_call_parser.h"

#include "server/deepseek_v3_tool_call_parser.h"
#include "server/glm_tool_call_parser.h"

namespace kiln {

bool is_tool_parser(const std::string& name) {
  return name == "glm47" || name == "deepseek_v3";
}

OutputParserNames output_parsers_for_model_type(const std::string& model_type) {
  if (model_type == "deepseek_v3") return {"deepseek_v3", ""};
  if (model_type == "glm4_moe_lite" || model_type == "glm4_moe" || model_type == "glm_moe_dsa" ||
      model_type == "glm5_next")
    return {"glm47", "glm45"};
  return {"", ""};
}

std::string resolve_tool_parser(const std::string& recipe_value, const std::string& model_type) {
  return recipe_value == "auto" ? output_parsers_for_model_type(model_type).tool_parser : recipe_value;
}

std::string resolve_reasoning_parser(const std::string& recipe_value, const std::string& model_type) {
  return recipe_value == "auto" ? output_parsers_for_model_type(model_type).reasoning_parser : recipe_value;
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
