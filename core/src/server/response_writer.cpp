#include "server/response_writer.h"

namespace kiln {

nlohmann::ordered_json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

std::string openai_finish_reason(const GenerationResult& result) {
  if (result.finish_reason == "stop" && !result.tool_calls.empty()) return "tool_calls";
  return result.finish_reason;
}

std::string sse_event(const nlohmann::ordered_json& data, const std::string& event_name) {
  std::string out;
  if (!event_name.empty()) out += "event: " + event_name + "\n";
  out += "data: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
  return out;
}

}  // namespace kiln
