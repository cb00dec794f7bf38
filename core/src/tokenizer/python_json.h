// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it (separators ", " and ": ",
// keys in insertion order), which is what transformers' `tojson` filter produces inside chat templates.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kiln {

std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace kiln
