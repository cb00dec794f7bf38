// One generation request as the HTTP thread sees it: submits to the engine, turns the token events delivered
// through its RequestStream into output pieces, measures TTFT/ITL, and cancels the engine request when the
// client leaves or a stop string ends it early.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/engine_api.h"
#include "server/output_pipeline.h"
#include "server/request_stream.h"
#include "server/server_metrics.h"

namespace kiln {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

// One generated token's logprobs as the engine reported them (TokenEvent).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

struct SessionUpdate {
  OutputPieces pieces;
  std::vector<TokenLogprob> logprobs;  // of the tokens received in this update (requests that asked)
  bool finished = false;
  std::string finish_reason;  // stop, length, abort, error (set when finished)
  std::string error;          // with "error"
  StatusCode error_code = StatusCode::kInternal;  // with "error": its kind (TokenEvent::error_code)
  // The latest prefill progress event since the last update (prefill_total 0: none).
  int64_t prefilled_tokens = 0, prefill_total = 0;
};

class GenerationSession {
 public:
  using Clock = std::chrono::steady_clock;

  GenerationSession(Engine& engine, ServerMetrics& metrics, const Tokenizer& tokenizer, OutputPipelineOptions output,
                    Clock::time_point arrival);
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  // `prefill` is answer text the prompt already ends with (a forced "<tool_call>name"); it is parsed as output.
  Status start(RequestParams params, const std::string& prefill);
  // Pieces produced since the last call; waits up to `timeout` for the engine when there are none.
  SessionUpdate next(std::chrono::milliseconds timeout);
  // The client is gone: the engine drops the sequence now.
  void abandon();

  bool finished() const { return finished_; }
  const Usage& usage() const { return usage_; }
  const std::vector<ParsedToolCall>& tool_calls() const { return pipeline_.tool_calls(); }

 private:
  void finish(SessionUpdate& update, std::string reason);

  Engine& engine_;
  ServerMetrics& metrics_;
  OutputPipeline pipeline_;
  std::shared_ptr<RequestStream> stream_ = std::make_shared<RequestStream>();
  Clock::time_point arrival_, last_token_;
  uint64_t request_id_ = 0;
  bool submitted_ = false, finished_ = false, seen_token_ = false;
  OutputPieces prefill_pieces_;
  Usage usage_;
};

}  // namespace kiln
