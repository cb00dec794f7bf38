// Validates a JSON value against a JSON Schema, for the strict-JSON and tool-call gates of `kiln qualify`.
// Debian's one C++ validator, libvalijson-dev (header-only), depends on Qt 5, Poco, yaml-cpp, jsoncpp, RapidJSON and
// picojson dev packages; nlohmann's json-schema-validator is not packaged. The gates only send schemas they wrote, so
// this checks the subset those use — type, properties, required,
// additionalProperties: false, items, enum, const, min/maxItems, min/maxLength, minimum/maximum — and reports any
// other keyword as unsupported instead of ignoring it (a check that skips a constraint would pass wrong answers).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kiln::cli {

// "" when `value` satisfies `schema`; otherwise the first violation, with its JSON pointer ("/items/2: expected
// integer, got string").
std::string json_schema_violation(const nlohmann::json& schema, const nlohmann::json& value);

}  // namespace kiln::cli
