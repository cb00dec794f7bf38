// POST /v1/completions: a raw prompt (a string, or token ids) continued as text; text_completion objects,
// streamed as SSE when asked. No chat template, reasoning split or tool parsing.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "server/response_writer.h"

namespace kiln {

std::optional<ApiError> prepare_completion(const ServerContext& ctx, const nlohmann::ordered_json& body,
                                           PreparedGeneration& out);

}  // namespace kiln
