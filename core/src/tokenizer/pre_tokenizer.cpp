#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "tokenizer/byte_level.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

Status unsupported(const std::string& field, const std::string& what) {
  return unimplemented(field + ": " + what);
}

Status malformed(const std::string& field, const std::string& what) {
  return data_loss(field + ": " + what);
}

Result<bool> optional_bool(const Json& json, const char* key, bool fallback, const std::string& field) {
  if (!json.contains(key) || json[key].is_null()) return fallback;
  if (!json[key].is_boolean()) return malformed(field + "." + key, "expected true or false");
  return json[key].get<bool>();
}

// One piece of a split: its byte range and whether the matched pattern marks it.
struct Span {
  std::size_t begin, end;
  bool is_match;
};

}  // namespace

Result<PreTokenizer> PreTokenizer::from_json(const Json& json, const std::string& field) {
  PreTokenizer pre_tokenizer;
  if (!json.is_null()) KILN_RETURN_IF_ERROR(add_steps(json, field, pre_tokenizer.steps_));
  return pre_tokenizer;
}

Status PreTokenizer::add_steps(const Json& json, const std::string& field, std::vector<Step>& steps) {
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return malformed(field, "expected an object with a string \"type\"");
  }
  const std::string type = json["type"].get<std::string>();
  if (type == "Sequence") {
    if (!json.contains("pretokenizers") || !json["pretokenizers"].is_array()) {
      return malformed(field + ".pretokenizers", "expected an array");
    }
    for (std::size_t i = 0; i < json["pretokenizers"].size(); ++i) {
      KILN_RETURN_IF_ERROR(
          add_steps(json["pretokenizers"][i], field + ".pretokenizers[" + std::to_string(i) + "]", steps));
    }
    return ok_status();
  }
  Step step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    KILN_ASSIGN_OR_RETURN(step.add_prefix_space, optional_bool(json, "add_prefix_space", true, field));
    KILN_ASSIGN_OR_RETURN(const bool use_regex, optional_bool(json, "use_regex", true, field));
    if (use_regex) {
      KILN_ASSIGN_OR_RETURN(OnigRegex regex, OnigRegex::compile(byte_level::kGpt2SplitPattern));
      step.regex.push_back(std::move(regex));
    }
    steps.push_back(std::move(step));
    return ok_status();
  }
  if (type != "Split") {
    return unsupported(field + ".type",
                       "pre-tokenizer '" + type + "' is not supported (supported: Split, ByteLevel, Sequence)");
  }
  const Json& pattern = json.contains("pattern") ? json["pattern"] : Json();
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    auto regex = OnigRegex::compile(pattern["Regex"].get<std::string>());
    if (!regex.ok()) return regex.status().with_context(field + ".pattern.Regex");
    step.regex.push_back(std::move(regex).value());
  } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    auto regex = OnigRegex::compile_literal(pattern["String"].get<std::string>());
    if (!regex.ok()) return regex.status().with_context(field + ".pattern.String");
    step.regex.push_back(std::move(regex).value());
  } else {
    return malformed(field + ".pattern", "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
  }
  const std::string behavior =
      json.contains("behavior") && json["behavior"].is_string() ? json["behavior"].get<std::string>() : std::string();
  if (behavior == "Removed") {
    step.behavior = Behavior::kRemoved;
  } else if (behavior == "Isolated") {
    step.behavior = Behavior::kIsolated;
  } else if (behavior == "MergedWithPrevious") {
    step.behavior = Behavior::kMergedWithPrevious;
  } else if (behavior == "MergedWithNext") {
    step.behavior = Behavior::kMergedWithNext;
  } else if (behavior == "Contiguous") {
    step.behavior = Behavior::kContiguous;
  } else {
    return malformed(field + ".behavior", "'" + behavior +
                                              "' is not one of Removed, Isolated, MergedWithPrevious, "
                                              "MergedWithNext, Contiguous");
  }
  KILN_ASSIGN_OR_RETURN(step.invert, optional_bool(json, "invert", false, field));
  steps.push_back(std::move(step));
  return ok_status();
}

bool PreTokenizer::is_byte_level() const {
  for (const Step& step : steps_) {
    if (step.byte_level) return true;
  }
  return false;
}

void PreTokenizer::split(const std::string& text, std::vector<std::string>& pieces) const {
  std::vector<std::string> current{text};
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    for (const std::string& piece : current) apply(step, piece, next);
    current.swap(next);
  }
  for (std::string& piece : current) {
    if (!piece.empty()) pieces.push_back(std::move(piece));
  }
}

void PreTokenizer::apply(const Step& step, const std::string& input, std::vector<std::string>& out) {
  std::string prefixed;
  const std::string* piece = &input;
  if (step.byte_level && step.add_prefix_space && (input.empty() || input[0] != ' ')) {
    prefixed = " " + input;
    piece = &prefixed;
  }
  if (step.regex.empty()) {
    if (!piece->empty()) out.push_back(step.byte_level ? byte_level::encode(*piece) : *piece);
    return;
  }

  // The whole piece as alternating matched / unmatched spans.
  std::vector<Span> spans;
  std::size_t previous = 0;
  for (const auto& [begin, end] : step.regex[0].find_all(*piece)) {
    if (previous != begin) spans.push_back({previous, begin, false});
    spans.push_back({begin, end, true});
    previous = end;
  }
  if (previous != piece->size()) spans.push_back({previous, piece->size(), false});
  if (step.invert) {
    for (Span& span : spans) span.is_match = !span.is_match;
  }

  // Resulting [begin, end) ranges; `removed` ranges are dropped.
  struct Range {
    std::size_t begin, end;
    bool removed;
  };
  std::vector<Range> ranges;
  bool previous_match = false;
  switch (step.byte_level ? Behavior::kIsolated : step.behavior) {
    case Behavior::kIsolated:
      for (const Span& s : spans) ranges.push_back({s.begin, s.end, false});
      break;
    case Behavior::kRemoved:
      for (const Span& s : spans) ranges.push_back({s.begin, s.end, s.is_match});
      break;
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !ranges.empty()) {
          ranges.back().end = s.end;
        } else {
          ranges.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !ranges.empty()) {
          ranges.back().end = s.end;
        } else {
          ranges.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !ranges.empty()) {
          ranges.back().begin = it->begin;
        } else {
          ranges.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
  }
  for (const Range& r : ranges) {
    if (r.removed || r.begin == r.end) continue;
    std::string text = piece->substr(r.begin, r.end - r.begin);
    out.push_back(step.byte_level ? byte_level::encode(text) : std::move(text));
  }
}

}  // namespace kiln
