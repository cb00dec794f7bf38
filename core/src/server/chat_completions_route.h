// POST /v1/chat/completions: OpenAI chat requests (messages incl. tool results, tools/tool_choice,
// chat_template_kwargs.enable_thinking) → GLM prompt; output as chat.completion or chat.completion.chunk SSE, with
// reasoning in `reasoning_content` and calls in `tool_calls` (streamed: id+name first, then argument deltas).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "server/response_writer.h"

namespace kiln {

std::optional<ApiError> prepare_chat_completion(const ServerContext& ctx, const nlohmann::ordered_json& body,
                                                PreparedGeneration& out);

}  // namespace kiln
