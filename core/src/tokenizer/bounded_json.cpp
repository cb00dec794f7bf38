#include "tokenizer/bounded_json.h"

namespace kiln {
namespace {

struct TooDeep {};

template <class Json>
bool parse_bounded(std::string_view text, Json& out, std::string& error) {
  // The callback sees each container open with `depth` = the number of containers around it.
  const typename Json::parser_callback_t limit = [](int depth, typename Json::parse_event_t event, Json&) {
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
  } catch (const typename Json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    error = e.what();
  }
  out = Json();
  return false;
}

}  // namespace

bool parse_bounded_json(std::string_view text, nlohmann::ordered_json& out, std::string& error) {
  return parse_bounded(text, out, error);
}

bool parse_bounded_json(std::string_view text, nlohmann::json& out, std::string& error) {
  return parse_bounded(text, out, error);
}

}  // namespace kiln
