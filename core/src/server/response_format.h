// The requested shape of an answer: chat's `response_format` and the Responses API's `text.format`, both
//   {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", <schema fields>}
// where chat nests the schema fields under "json_schema" ({"name", "schema", "strict", "description"}) and the
// Responses API puts them beside "type". JSON formats become a TokenConstraint on the request (constrained decoding,
// server/structured_output.h); a format that cannot be honoured is a 400 naming the field at fault.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/generation_request.h"

namespace kiln {

// `field` is where `format` sat in the request ("response_format", "text.format"); `nested` says the schema fields
// are under "json_schema" (chat) rather than beside "type" (Responses). Sets request.params.constraint for a JSON
// format (the JSON after free reasoning when `reasoning` is enabled) and leaves it unset for text.
std::optional<ApiError> read_response_format(const ServerContext& ctx, const nlohmann::ordered_json& format,
                                             const std::string& field, bool nested, const ReasoningPrefix& reasoning,
                                             GenerationRequest& request);

}  // namespace kiln
