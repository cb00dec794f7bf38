#include "engine/single_request.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

namespace kiln {

Result<std::vector<int32_t>> run_single_request(Engine& engine, RequestParams params,
                                                const std::function<bool(int32_t)>& on_token,
                                                SingleRequestStats* stats) {
  using Clock = std::chrono::steady_clock;
  struct Shared {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::vector<int32_t> tokens;
    TokenEvent last;
    Clock::time_point first, end;
  };
  auto shared = std::make_shared<Shared>();
  const int64_t prompt = static_cast<int64_t>(params.prompt.size());
  const Clock::time_point start = Clock::now();
  // Events arrive on the engine's thread; the sink keeps `shared` alive past this function's return.
  TokenSink sink = [shared, on_token](const TokenEvent& e) {
    bool keep = true;
    if (e.token >= 0) {
      {
        std::lock_guard<std::mutex> lock(shared->mutex);
        if (shared->tokens.empty()) shared->first = Clock::now();
        shared->tokens.push_back(e.token);
      }
      if (on_token) keep = on_token(e.token);
    }
    if (e.finished || !keep) {
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->last = e;
      shared->end = Clock::now();
      shared->done = true;
      shared->done_cv.notify_all();
    }
    return keep;
  };
  KILN_ASSIGN_OR_RETURN(uint64_t id, engine.submit(std::move(params), std::move(sink)));
  (void)id;
  std::unique_lock<std::mutex> lock(shared->mutex);
  shared->done_cv.wait(lock, [&] { return shared->done; });
  if (shared->last.finish_reason == FinishReason::kError)
    return internal_error(shared->last.error.empty() ? "the engine ended the request with an error" : shared->last.error);
  if (stats) {
    stats->prompt_tokens = prompt;
    stats->generated_tokens = static_cast<int64_t>(shared->tokens.size());
    if (!shared->tokens.empty()) {
      stats->prefill_seconds = std::chrono::duration<double>(shared->first - start).count();
      stats->decode_seconds = std::chrono::duration<double>(shared->end - shared->first).count();
    }
    stats->stopped_by_token = shared->last.finish_reason == FinishReason::kStop;
  }
  return shared->tokens;
}

}  // namespace kiln
