// POST /v1/responses (OpenAI Responses API): `input` as a string or items (messages, function_call,
// function_call_output, reasoning), `instructions`, flat function `tools`; output items reasoning / message /
// function_call, non-streamed or as typed SSE events (response.created, response.output_item.added,
// response.output_text.delta, response.function_call_arguments.delta, ..., response.completed).
// Responses are not stored, so previous_response_id is refused.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "server/response_writer.h"

namespace kiln {

std::optional<ApiError> prepare_response(const ServerContext& ctx, const nlohmann::ordered_json& body,
                                         PreparedGeneration& out);

}  // namespace kiln
