// A request with n > 1 choices (chat and completions): one engine sequence per choice, each with its own session
// (the request's sampling with seed + i, so seeded choices differ and are reproducible; a fresh copy of its
// constraint) and its own writer (the choice's index, the response's id). Their output interleaves in one stream,
// or merges into one body; usage counts the prompt once and every choice's completion tokens.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/response_writer.h"

namespace kiln {

class ChoiceSet {
 public:
  using Clock = GenerationSession::Clock;

  // Submits every choice; an error (nothing left running) when one cannot start.
  static Result<std::unique_ptr<ChoiceSet>> start(Engine& engine, ServerMetrics& metrics, const Tokenizer& tokenizer,
                                                  PreparedGeneration& prepared, Clock::time_point arrival);
  ~ChoiceSet();

  // Drives every unfinished choice, waiting up to `timeout` in all when none has output. Returns the SSE text since
  // the last call (the role chunks first; each choice's finish chunk as it ends; the usage chunk and [DONE] when
  // all have ended).
  std::string stream_next(std::chrono::milliseconds timeout);
  // Non-streaming: drives the choices; true once all have ended.
  bool poll(std::chrono::milliseconds timeout);
  // The merged body once poll() returned true.
  nlohmann::ordered_json body();

  bool finished() const { return finished_; }
  // A choice failed in the engine: its kind and message (the stream then ended with an error event).
  const std::optional<Status>& error() const { return error_; }
  void abandon();

 private:
  struct Choice {
    std::unique_ptr<GenerationSession> session;
    std::unique_ptr<ResponseWriter> writer;
    OutputPieces pieces;  // non-streaming: everything so far
    std::string finish_reason;
    bool done = false;
  };
  ChoiceSet() = default;
  // One round over the unfinished choices; appends what each produced to `out` (streaming) or its pieces.
  void drive(std::chrono::milliseconds timeout, std::string* out);
  Usage total_usage() const;

  std::vector<Choice> choices_;
  bool begun_ = false, finished_ = false;
  std::optional<Status> error_;
};

}  // namespace kiln
