#include "server/choice_set.h"

namespace kiln {

Result<std::unique_ptr<ChoiceSet>> ChoiceSet::start(Engine& engine, ServerMetrics& metrics, const Tokenizer& tokenizer,
                                                    PreparedGeneration& prepared, Clock::time_point arrival) {
  GenerationRequest& request = prepared.request;
  std::unique_ptr<ChoiceSet> set(new ChoiceSet());
  for (int i = 0; i < request.n; ++i) {
    Choice c;
    c.writer = prepared.writer->for_choice(i);
    if (!c.writer) return invalid_argument("n: this route returns one output");
    RequestParams params = request.params;  // the prompt and media are copied once per choice
    params.sampling.seed = request.params.sampling.seed + static_cast<uint64_t>(i);
    if (request.params.constraint && i > 0) {
      params.constraint = request.params.constraint->fresh();
      if (!params.constraint) return invalid_argument("n: this request's constraint cannot be given to more choices");
    }
    c.session = std::make_unique<GenerationSession>(engine, metrics, tokenizer, request.output, arrival);
    KILN_RETURN_IF_ERROR(c.session->start(std::move(params), request.prefill));
    set->choices_.push_back(std::move(c));
  }
  return set;
}

ChoiceSet::~ChoiceSet() { abandon(); }

void ChoiceSet::abandon() {
  for (Choice& c : choices_)
    if (c.session) c.session->abandon();
}

Usage ChoiceSet::total_usage() const {
  Usage total = choices_.front().session->usage();
  total.completion_tokens = 0;
  for (const Choice& c : choices_) total.completion_tokens += c.session->usage().completion_tokens;
  return total;
}

void ChoiceSet::drive(std::chrono::milliseconds timeout, std::string* out) {
  // The wait is shared out: the first choice that is still running waits, the others are only drained, so a
  // round never takes much longer than `timeout` however many choices there are.
  bool waited = false;
  for (Choice& c : choices_) {
    if (c.done) continue;
    SessionUpdate update = c.session->next(waited ? std::chrono::milliseconds(0) : timeout);
    waited = true;
    c.writer->add_logprobs(std::move(update.logprobs));
    if (out) {
      *out += c.writer->stream_pieces(update.pieces);
    } else {
      append_pieces(c.pieces, std::move(update.pieces));
    }
    if (!update.finished) continue;
    c.done = true;
    c.finish_reason = update.finish_reason;
    if (update.finish_reason == "error" && !error_) error_ = Status(update.error_code, update.error);
    if (out && update.finish_reason != "error")
      *out += c.writer->stream_finish({update.finish_reason, c.session->usage(), c.session->tool_calls()});
  }
  bool all = true;
  for (const Choice& c : choices_) all = all && c.done;
  if (error_) {
    abandon();  // one choice failed: the response as a whole did
    all = true;
  }
  if (all && !finished_) {
    finished_ = true;
    if (out && !error_) *out += choices_.front().writer->stream_close(total_usage());
  }
}

std::string ChoiceSet::stream_next(std::chrono::milliseconds timeout) {
  std::string out;
  if (!begun_) {
    for (Choice& c : choices_) out += c.writer->stream_begin();
    begun_ = true;
  }
  if (!finished_) drive(timeout, &out);
  return out;
}

bool ChoiceSet::poll(std::chrono::milliseconds timeout) {
  if (!finished_) drive(timeout, nullptr);
  return finished_;
}

nlohmann::ordered_json ChoiceSet::body() {
  nlohmann::ordered_json merged;
  for (Choice& c : choices_) {
    nlohmann::ordered_json one =
        c.writer->complete(c.pieces, {c.finish_reason, c.session->usage(), c.session->tool_calls()});
    if (merged.is_null()) {
      merged = std::move(one);
    } else {
      for (auto& choice : one["choices"]) merged["choices"].push_back(std::move(choice));
    }
  }
  merged["usage"] = usage_json(total_usage());
  return merged;
}

}  // namespace kiln
