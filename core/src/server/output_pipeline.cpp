#include "server/output_pipeline.h"

#include <random>

namespace kiln {

std::string random_id(const std::string& prefix, int length) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, sizeof(kAlphabet) - 2);
  std::string id = prefix;
  for (int i = 0; i < length; ++i) id += kAlphabet[pick(rng)];
  return id;
}

OutputPipeline::OutputPipeline(const Tokenizer& tokenizer, OutputPipelineOptions options)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      decoder_(tokenizer, /*skip_special=*/false),
      stop_(options_.stop_strings),
      stop_ids_(options_.stop_token_ids.begin(), options_.stop_token_ids.end()) {
  if (options_.split_reasoning) reasoning_.emplace(options_.starts_in_reasoning);
  tools_ = make_tool_call_parser(options_.tool_parser, options_.tools, [] { return random_id("call_"); });
  // Tools offered without a parser to take their calls leave the calls in the text, markers and all.
  skip_special_ = options_.skip_special_tokens && !tools_ && options_.tools.empty();
  if (skip_special_)
    for (const char* marker : {"<think>", "</think>"})
      if (auto id = tokenizer.token_to_id(marker)) kept_special_.insert(*id);
}

const std::vector<ParsedToolCall>& OutputPipeline::tool_calls() const {
  static const std::vector<ParsedToolCall> kNone;
  return tools_ ? tools_->calls() : kNone;
}

OutputPieces OutputPipeline::route(const std::string& text, bool final) {
  OutputPieces after_reasoning;
  if (reasoning_) {
    after_reasoning = reasoning_->feed(text);
    if (final) append_pieces(after_reasoning, reasoning_->flush());
  } else {
    append_text(after_reasoning, OutputPiece::Kind::kContent, text);
  }
  if (!tools_) return after_reasoning;
  OutputPieces out;
  for (auto& piece : after_reasoning) {
    if (piece.kind == OutputPiece::Kind::kContent) {
      append_pieces(out, tools_->feed(piece.text));
    } else {
      append_piece(out, std::move(piece));
    }
  }
  if (final) append_pieces(out, tools_->flush());
  return out;
}

OutputPieces OutputPipeline::feed_token(int32_t id) {
  if (stop_ids_.count(id) || stop_.matched()) return {};
  if (skip_special_ && tokenizer_.is_special(id) && !kept_special_.count(id)) return {};
  return route(stop_.feed(decoder_.feed(id)), false);
}

OutputPieces OutputPipeline::start(const std::string& prefill) {
  if (tools_ && !options_.forced_tool_name.empty()) {
    // The name is fixed by the request, so the call starts now rather than when the model ends the name.
    return tools_->begin_call(options_.forced_tool_name);
  }
  return route(prefill, false);
}

OutputPieces OutputPipeline::finish() {
  std::string tail = stop_.matched() ? std::string() : stop_.feed(decoder_.flush());
  tail += stop_.flush();
  return route(tail, true);
}

}  // namespace kiln
