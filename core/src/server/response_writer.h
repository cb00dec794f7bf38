// How one route (chat, completions, responses) writes a generation: as SSE events while it streams, or as one
// JSON body at the end. The server's generation driver is shared; only the shapes differ.
#pragma once

#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/generation_request.h"
#include "server/generation_session.h"
#include "server/output_piece.h"
#include "server/tool_call_parser.h"

namespace kiln {

struct GenerationResult {
  std::string finish_reason;  // stop, length, abort
  Usage usage;
  std::vector<ParsedToolCall> tool_calls;
};

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // SSE text (zero or more "event:/data:" blocks) for each stage of a stream.
  virtual std::string stream_begin() = 0;
  virtual std::string stream_pieces(const OutputPieces& pieces) = 0;
  virtual std::string stream_end(const GenerationResult& result) = 0;
  virtual std::string stream_error(const ApiError& error) = 0;
  // The whole non-streamed body.
  virtual nlohmann::ordered_json complete(const OutputPieces& pieces, const GenerationResult& result) = 0;

  // n > 1 (routes with choices): a writer of the same response (id, created) for choice `index`; null where the
  // route has one output. Its stream_end is then split: stream_finish ends one choice, stream_close (once, from
  // any of them) the whole stream with the total usage.
  virtual std::unique_ptr<ResponseWriter> for_choice(int) const { return nullptr; }
  virtual std::string stream_finish(const GenerationResult& result) { return stream_end(result); }
  virtual std::string stream_close(const Usage&) { return {}; }
  // Logprobs of the tokens received since the last call: the writer puts them on the next chunk it writes (or in
  // the final body). Called before stream_pieces / stream_end / complete.
  void add_logprobs(std::vector<TokenLogprob> entries) {
    pending_logprobs_.insert(pending_logprobs_.end(), std::make_move_iterator(entries.begin()),
                             std::make_move_iterator(entries.end()));
  }

 protected:
  std::vector<TokenLogprob> pending_logprobs_;
};

// A parsed request and the writer for its route.
struct PreparedGeneration {
  GenerationRequest request;
  std::unique_ptr<ResponseWriter> writer;
};

nlohmann::ordered_json usage_json(const Usage& usage);
// OpenAI's finish_reason: "tool_calls" when a stop ended a turn that called tools.
std::string openai_finish_reason(const GenerationResult& result);

// "data: <json>\n\n" (and "event: <name>\n" first when named).
std::string sse_event(const nlohmann::ordered_json& data, const std::string& event_name = "");

}  // namespace kiln
