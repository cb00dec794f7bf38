#include "server/deepseek_v3_tool_call_parser.h"

#include <algorithm>

#include "tokenizer/bounded_json.h"

namespace kiln {

const std::string DeepSeekV3ToolCallParser::kCallsBegin = "<｜tool▁calls▁begin｜>";
const std::string DeepSeekV3ToolCallParser::kCallBegin = "<｜tool▁call▁begin｜>";
const std::string DeepSeekV3ToolCallParser::kSep = "<｜tool▁sep｜>";
const std::string DeepSeekV3ToolCallParser::kCallEnd = "<｜tool▁call▁end｜>";
const std::string DeepSeekV3ToolCallParser::kCallsEnd = "<｜tool▁calls▁end｜>";
const std::string DeepSeekV3ToolCallParser::kArgumentsOpen = "\n```json\n";
const std::string DeepSeekV3ToolCallParser::kArgumentsClose = "\n```";

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool is_proper_prefix_of(std::string_view text, std::string_view marker) {
  return text.size() < marker.size() && marker.substr(0, text.size()) == text;
}

// The arguments of a call body after its name: the JSON inside a ```json fence (models sometimes drop the fence,
// so bare JSON is read too).
std::string_view fenced_json(std::string_view rest) {
  rest = trim(rest);
  if (starts_with(rest, "```json")) {
    rest.remove_prefix(7);
    if (rest.size() < 3 || rest.substr(rest.size() - 3) != "```") return {};
    rest.remove_suffix(3);
  }
  return trim(rest);
}

}  // namespace

DeepSeekV3ToolCallParser::DeepSeekV3ToolCallParser(const nlohmann::ordered_json& /*tools*/,
                                                   std::function<std::string()> make_id)
    : make_id_(std::move(make_id)) {}

bool DeepSeekV3ToolCallParser::emit_call(OutputPieces& out, const std::string& body) {
  const size_t sep = body.find(kSep);
  if (sep == std::string::npos || trim(std::string_view(body).substr(0, sep)) != "function") return false;
  std::string_view after = std::string_view(body).substr(sep + kSep.size());
  const size_t line_end = after.find('\n');
  const std::string_view name = trim(after.substr(0, line_end));
  if (name.empty() || line_end == std::string_view::npos) return false;
  const std::string_view arguments = fenced_json(after.substr(line_end));
  nlohmann::ordered_json parsed;
  std::string error;
  if (arguments.empty() || !parse_bounded_json(arguments, parsed, error) || !parsed.is_object()) return false;
  ParsedToolCall call;
  call.id = make_id_();
  call.name = std::string(name);
  call.arguments = std::string(arguments);
  call.complete = true;
  calls_.push_back(call);
  OutputPiece start;
  start.kind = OutputPiece::Kind::kToolCallStart;
  start.tool_index = static_cast<int>(calls_.size()) - 1;
  start.tool_id = call.id;
  start.tool_name = call.name;
  out.push_back(std::move(start));
  OutputPiece args;
  args.kind = OutputPiece::Kind::kToolCallArguments;
  args.tool_index = static_cast<int>(calls_.size()) - 1;
  args.text = call.arguments;
  out.push_back(std::move(args));
  return true;
}

bool DeepSeekV3ToolCallParser::step(OutputPieces& out) {
  switch (state_) {
    case State::kText: {
      const size_t open = pending_.find(kCallsBegin);
      if (open == std::string::npos) {
        const size_t keep_from = partial_marker_start(pending_, kCallsBegin);
        append_text(out, OutputPiece::Kind::kContent, pending_.substr(0, keep_from));
        pending_.erase(0, keep_from);
        return false;
      }
      append_text(out, OutputPiece::Kind::kContent, pending_.substr(0, open));
      pending_.erase(0, open + kCallsBegin.size());
      state_ = State::kSection;
      return true;
    }
    case State::kSection: {
      // Between calls: layout whitespace, the next call, or the end of the section.
      size_t n = 0;
      while (n < pending_.size() && is_space(pending_[n])) ++n;
      const std::string_view rest = std::string_view(pending_).substr(n);
      if (starts_with(rest, kCallBegin)) {
        pending_.erase(0, n + kCallBegin.size());
        state_ = State::kCall;
        return true;
      }
      if (starts_with(rest, kCallsEnd)) {
        pending_.erase(0, n + kCallsEnd.size());
        state_ = State::kText;
        return true;
      }
      if (rest.empty() || is_proper_prefix_of(rest, kCallBegin) || is_proper_prefix_of(rest, kCallsEnd)) return false;
      // Stray text inside the section is content, up to the next markup.
      const size_t next = std::min(pending_.find(kCallBegin), pending_.find(kCallsEnd));
      if (next == std::string::npos) return false;
      append_text(out, OutputPiece::Kind::kContent, pending_.substr(0, next));
      pending_.erase(0, next);
      return true;
    }
    case State::kCall: {
      // A call ends at its own end marker; another call's begin, or the section's end, before it means this one
      // was broken off, and its text is content.
      const size_t end = pending_.find(kCallEnd);
      const size_t broken = std::min(pending_.find(kCallBegin), pending_.find(kCallsEnd));
      if (end == std::string::npos && broken == std::string::npos) return false;
      if (end < broken) {
        const std::string body = pending_.substr(0, end);
        if (!emit_call(out, body)) append_text(out, OutputPiece::Kind::kContent, kCallBegin + body + kCallEnd);
        pending_.erase(0, end + kCallEnd.size());
      } else {
        append_text(out, OutputPiece::Kind::kContent, kCallBegin + pending_.substr(0, broken));
        pending_.erase(0, broken);
      }
      state_ = State::kSection;
      return true;
    }
  }
  return false;
}

OutputPieces DeepSeekV3ToolCallParser::feed(std::string_view text) {
  OutputPieces out;
  pending_ += text;
  while (step(out)) {
  }
  return out;
}

OutputPieces DeepSeekV3ToolCallParser::begin_call(const std::string& name) {
  // The prompt wrote the call's head; reading it as if generated keeps one path through the call.
  state_ = State::kCall;
  pending_ = "function" + kSep + name + kArgumentsOpen + pending_;
  return {};
}

OutputPieces DeepSeekV3ToolCallParser::flush() {
  OutputPieces out;
  // Whatever is held back is content: text, a partial marker, or a call cut off before its end.
  append_text(out, OutputPiece::Kind::kContent, state_ == State::kCall ? kCallBegin + pending_ : pending_);
  pending_.clear();
  state_ = State::kText;
  return out;
}

}  // namespace kiln
