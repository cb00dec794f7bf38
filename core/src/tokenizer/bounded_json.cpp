#include "tokenizer/bounded_json.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

struct TooDeep {};

}  // namespace

bool parse_bounded_json(std::string_view text, Json& out, std::string& error) {
  // The callback sees each container open with `depth` = the number of containers around it.
  const Json::parser_callback_t limit = [](int depth, Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonNesting) {
      throw TooDeep{};
    }
    return true;
  };
  try {
    out = Json::parse(text, limit);
    return true;
  } catch (const TooDeep&) {
    error = "JSON nested deeper than " + std::to_string(kMaxJsonNesting) + " levels";
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    error = e.what();
  }
  out = Json();
  return false;
}

}  // namespace kiln
