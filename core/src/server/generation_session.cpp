#include "server/generation_session.h"

namespace kiln {
namespace {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    default:
      return "stop";
  }
}

double seconds_between(GenerationSession::Clock::time_point a, GenerationSession::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

GenerationSession::GenerationSession(Engine& engine, ServerMetrics& metrics, const Tokenizer& tokenizer,
                                     OutputPipelineOptions output, Clock::time_point arrival)
    : engine_(engine), metrics_(metrics), pipeline_(tokenizer, std::move(output)), arrival_(arrival) {}

GenerationSession::~GenerationSession() {
  if (submitted_ && !finished_) abandon();
}

Status GenerationSession::start(RequestParams params, const std::string& prefill) {
  usage_.prompt_tokens = static_cast<int64_t>(params.prompt.size());
  if (!prefill.empty()) prefill_pieces_ = pipeline_.start(prefill);
  auto id = engine_.submit(std::move(params), stream_->make_sink());
  if (!id.ok()) return id.status();
  request_id_ = *id;
  submitted_ = true;
  return ok_status();
}

void GenerationSession::abandon() {
  stream_->close();
  if (submitted_ && !finished_) {
    engine_.cancel(request_id_);
    finished_ = true;
    metrics_.count_finished("abort");
  }
}

void GenerationSession::finish(SessionUpdate& update, std::string reason) {
  append_pieces(update.pieces, pipeline_.finish());
  update.finished = true;
  update.finish_reason = reason;
  finished_ = true;
  metrics_.count_finished(reason);
  metrics_.observe_request_latency(seconds_between(arrival_, Clock::now()));
}

SessionUpdate GenerationSession::next(std::chrono::milliseconds timeout) {
  SessionUpdate update;
  update.pieces = std::move(prefill_pieces_);
  prefill_pieces_.clear();
  if (finished_) {
    update.finished = true;
    return update;
  }
  for (const TokenEvent& event : stream_->wait(update.pieces.empty() ? timeout : std::chrono::milliseconds(0))) {
    usage_.prompt_tokens = event.prompt_tokens > 0 ? event.prompt_tokens : usage_.prompt_tokens;
    usage_.cached_tokens = event.cached_prompt_tokens;
    if (event.token < 0 && !event.finished && event.prefilled_tokens > 0) {
      update.prefilled_tokens = event.prefilled_tokens;
      update.prefill_total = event.prompt_tokens;
    }
    if (event.token >= 0) {
      auto now = Clock::now();
      if (!seen_token_) {
        metrics_.observe_time_to_first_token(seconds_between(arrival_, now));
        seen_token_ = true;
      } else {
        metrics_.observe_inter_token_latency(seconds_between(last_token_, now));
      }
      last_token_ = now;
      usage_.completion_tokens = event.completion_tokens;
      if (event.has_logprobs) update.logprobs.push_back({event.token, event.logprob, event.top_logprobs});
      append_pieces(update.pieces, pipeline_.feed_token(event.token));
      if (pipeline_.stopped_by_string()) {
        // The engine would keep generating past the stop string: release the sequence now.
        stream_->close();
        engine_.cancel(request_id_);
        finish(update, "stop");
        return update;
      }
    }
    if (event.finished) {
      if (event.finish_reason == FinishReason::kError) {
        update.error = event.error;
        update.error_code = event.error_code;
      }
      finish(update, finish_reason_name(event.finish_reason));
      return update;
    }
  }
  return update;
}

}  // namespace kiln
