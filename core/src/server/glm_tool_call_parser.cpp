#include "server/glm_tool_call_parser.h"

#include <algorithm>

#include "tokenizer/bounded_json.h"

namespace kiln {
namespace {

const std::string kCallOpen = "<tool_call>";
const std::string kCallClose = "</tool_call>";
const std::string kKeyOpen = "<arg_key>";
const std::string kKeyClose = "</arg_key>";
const std::string kValueOpen = "<arg_value>";
const std::string kValueClose = "</arg_value>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

void drop_leading_space(std::string& s) {
  size_t n = 0;
  while (n < s.size() && is_space(s[n])) ++n;
  s.erase(0, n);
}

// A JSON string literal; a stray byte of a split character becomes U+FFFD rather than an exception.
std::string json_quote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// JSON string escaping without the quotes; escaping is per character, so pieces escape independently.
std::string json_escape(const std::string& s) {
  std::string quoted = json_quote(s);
  return quoted.substr(1, quoted.size() - 2);
}

// Largest n <= end such that text[0, n) does not end inside a UTF-8 sequence: a character split across chunks
// is escaped once it is whole.
size_t utf8_boundary(const std::string& text, size_t end) {
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    unsigned char c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? end - back : end;
  }
  return end;
}

bool is_proper_prefix_of(const std::string& text, const std::string& marker) {
  return text.size() < marker.size() && marker.compare(0, text.size(), text) == 0;
}

}  // namespace

GlmToolCallParser::GlmToolCallParser(const nlohmann::ordered_json& tools, std::function<std::string()> make_id)
    : tools_(tools), make_id_(std::move(make_id)) {}

bool GlmToolCallParser::value_is_string(const std::string& key) const {
  if (calls_.empty() || !tools_.is_array()) return false;
  for (const auto& tool : tools_) {
    const auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object() || fn->value("name", "") != calls_.back().name) continue;
    const auto params = fn->find("parameters");
    if (params == fn->end() || !params->is_object()) return false;
    const auto props = params->find("properties");
    if (props == params->end() || !props->is_object() || !props->contains(key)) return false;
    const auto& prop = (*props)[key];
    return prop.is_object() && prop.contains("type") && prop["type"] == "string";
  }
  return false;
}

void GlmToolCallParser::emit_arguments(OutputPieces& out, const std::string& text) {
  if (text.empty()) return;
  calls_.back().arguments += text;
  OutputPiece piece;
  piece.kind = OutputPiece::Kind::kToolCallArguments;
  piece.tool_index = static_cast<int>(calls_.size()) - 1;
  piece.text = text;
  append_piece(out, std::move(piece));
}

void GlmToolCallParser::start_call(OutputPieces& out, const std::string& name) {
  ParsedToolCall call;
  call.id = make_id_();
  call.name = name;
  calls_.push_back(call);
  OutputPiece start;
  start.kind = OutputPiece::Kind::kToolCallStart;
  start.tool_index = static_cast<int>(calls_.size()) - 1;
  start.tool_id = call.id;
  start.tool_name = call.name;
  append_piece(out, std::move(start));
  args_in_call_ = 0;
}

OutputPieces GlmToolCallParser::begin_call(const std::string& name) {
  OutputPieces out;
  start_call(out, name);
  state_ = State::kAfterValue;  // next: <arg_key> or </tool_call>
  return out;
}

bool GlmToolCallParser::step(OutputPieces& out) {
  switch (state_) {
    case State::kText: {
      size_t open = pending_.find(kCallOpen);
      if (open == std::string::npos) {
        size_t keep_from = partial_marker_start(pending_, kCallOpen);
        append_text(out, OutputPiece::Kind::kContent, pending_.substr(0, keep_from));
        pending_.erase(0, keep_from);
        return false;
      }
      append_text(out, OutputPiece::Kind::kContent, pending_.substr(0, open));
      pending_.erase(0, open + kCallOpen.size());
      state_ = State::kName;
      return true;
    }
    case State::kName: {
      size_t key = pending_.find(kKeyOpen), close = pending_.find(kCallClose);
      size_t end = std::min(key, close);
      if (end == std::string::npos) return false;
      start_call(out, trim(std::string_view(pending_).substr(0, end)));
      if (end == key) {
        pending_.erase(0, key + kKeyOpen.size());
        state_ = State::kKey;
      } else {
        pending_.erase(0, close + kCallClose.size());
        emit_arguments(out, "{}");
        calls_.back().complete = true;
        state_ = State::kText;
      }
      return true;
    }
    case State::kKey: {
      size_t close = pending_.find(kKeyClose);
      if (close == std::string::npos) return false;
      key_ = trim(std::string_view(pending_).substr(0, close));
      pending_.erase(0, close + kKeyClose.size());
      state_ = State::kBeforeValue;
      return true;
    }
    case State::kBeforeValue: {
      drop_leading_space(pending_);
      size_t open = pending_.find(kValueOpen);
      if (open == std::string::npos) return false;
      pending_.erase(0, open + kValueOpen.size());
      streaming_string_ = value_is_string(key_);
      value_started_ = false;
      std::string prefix = (args_in_call_ == 0 ? "{" : ", ") + json_quote(key_) + ": ";
      if (streaming_string_) prefix += "\"";
      emit_arguments(out, prefix);
      ++args_in_call_;
      state_ = State::kValue;
      return true;
    }
    case State::kValue: {
      size_t close = pending_.find(kValueClose);
      if (streaming_string_) {
        // Whitespace around a value is layout (GLM-4.5 writes newlines there; grammars allow it), not the string:
        // leading whitespace is dropped, trailing whitespace held back until text follows it.
        if (!value_started_) {
          drop_leading_space(pending_);
          if (pending_.empty()) return false;
          value_started_ = true;
          close = pending_.find(kValueClose);
        }
        size_t end =
            close == std::string::npos ? utf8_boundary(pending_, partial_marker_start(pending_, kValueClose)) : close;
        size_t text_end = end;
        while (text_end > 0 && is_space(pending_[text_end - 1])) --text_end;
        emit_arguments(out, json_escape(pending_.substr(0, text_end)));
        if (close == std::string::npos) {
          pending_.erase(0, text_end);
          return false;
        }
        pending_.erase(0, close);
        emit_arguments(out, "\"");
      } else {
        if (close == std::string::npos) return false;
        std::string raw = trim(std::string_view(pending_).substr(0, close));
        // A value that is not JSON (or nests too deep to re-serialise safely) is passed on as a string.
        nlohmann::ordered_json parsed;
        std::string error;
        emit_arguments(out, parse_bounded_json(raw, parsed, error)
                                ? parsed.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                                : json_quote(raw));
        pending_.erase(0, close);
      }
      pending_.erase(0, kValueClose.size());
      state_ = State::kAfterValue;
      return true;
    }
    case State::kAfterValue: {
      drop_leading_space(pending_);
      if (pending_.compare(0, kKeyOpen.size(), kKeyOpen) == 0) {
        pending_.erase(0, kKeyOpen.size());
        state_ = State::kKey;
        return true;
      }
      if (pending_.compare(0, kCallClose.size(), kCallClose) == 0) {
        pending_.erase(0, kCallClose.size());
        emit_arguments(out, args_in_call_ == 0 ? "{}" : "}");
        calls_.back().complete = true;
        state_ = State::kText;
        return true;
      }
      if (pending_.empty() || is_proper_prefix_of(pending_, kKeyOpen) || is_proper_prefix_of(pending_, kCallClose)) {
        return false;
      }
      // Stray text between arguments: skip to the next tag.
      size_t next = std::min(pending_.find(kKeyOpen), pending_.find(kCallClose));
      if (next == std::string::npos) return false;
      pending_.erase(0, next);
      return true;
    }
  }
  return false;
}

OutputPieces GlmToolCallParser::feed(std::string_view text) {
  OutputPieces out;
  pending_ += text;
  while (step(out)) {
  }
  return out;
}

OutputPieces GlmToolCallParser::flush() {
  OutputPieces out;
  if (state_ == State::kText) {
    append_text(out, OutputPiece::Kind::kContent, std::move(pending_));
  } else if (state_ == State::kName) {
    append_text(out, OutputPiece::Kind::kContent, kCallOpen + pending_);
  }
  // A call cut off after its name stays as streamed (incomplete arguments); the finish reason says why.
  pending_.clear();
  state_ = State::kText;
  return out;
}

}  // namespace kiln
