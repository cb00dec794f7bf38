#include "engine_decode_run.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>

#include "engine/batch_engine.h"
#include "engine/instance_runner.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

// What the sinks (on the engine's thread) hand to the waiting caller.
struct Collected {
  std::mutex mutex;
  std::condition_variable done_cv;
  size_t open = 0;
  std::string error;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<Clock::time_point>> times;
};

}  // namespace

Result<EngineBench> make_engine_bench(const LoadedModel& model, const Recipe& recipe, int64_t max_depth) {
  EngineBench b;
  // A drafter with no caches of its own adds nothing to the plan: the pool is the plain one.
  KILN_ASSIGN_OR_RETURN(b.plan, plan_engine(model, recipe));
  b.plan.config.prefix_caching = false;
  // As plan_engine reserves them for a recipe's drafter of speculative.depth = K.
  b.plan.config.lookahead_slots = 2 * max_depth;
  KILN_ASSIGN_OR_RETURN(b.caches, make_cache_manager(model, b.plan));
  return b;
}

Result<EngineDecodeRun> run_engine_decode(const LoadedModel& model, EngineBench& bench,
                                          const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
                                          const DecodeWindow& window, std::shared_ptr<Drafter> drafter,
                                          int64_t depth) {
  EngineConfig config = bench.plan.config;
  config.speculative_depth = drafter ? depth : 0;  // the oracle is no recipe choice: set as speculative.depth would
  config.speculative_max_batch = 0;
  if (config.speculative_depth > config.lookahead_slots)
    return invalid_argument("drafting depth " + std::to_string(depth) + " exceeds the " +
                            std::to_string(config.lookahead_slots) + " positions the pool reserves past a pass");
  auto runner = std::make_unique<InstanceRunner>(*model.model, *bench.caches);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<BatchEngine> engine,
                        BatchEngine::create(config, std::move(runner), drafter, bench.caches));

  auto shared = std::make_shared<Collected>();
  shared->tokens.resize(prompts.size());
  shared->times.resize(prompts.size());
  shared->open = prompts.size();
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = max_tokens;
    TokenSink sink = [shared, i](const TokenEvent& e) {
      const Clock::time_point now = Clock::now();
      std::lock_guard<std::mutex> lock(shared->mutex);
      if (e.token >= 0) {
        shared->tokens[i].push_back(e.token);
        shared->times[i].push_back(now);
      }
      if (e.finished) {
        if (e.finish_reason == FinishReason::kError || e.finish_reason == FinishReason::kAbort)
          if (shared->error.empty()) shared->error = e.error.empty() ? "the engine aborted a request" : e.error;
        if (--shared->open == 0) shared->done_cv.notify_all();
      }
      return true;
    };
    if (auto id = engine->submit(std::move(p), std::move(sink)); !id.ok()) {
      engine->drain();
      return id.status().with_context("submitting request " + std::to_string(i) + " of " +
                                      std::to_string(prompts.size()));
    }
  }
  {
    std::unique_lock<std::mutex> lock(shared->mutex);
    shared->done_cv.wait(lock, [&] { return shared->open == 0; });
  }
  engine->drain();  // joins the loop: the drafter is no longer called
  if (!shared->error.empty()) return internal_error("engine decode: " + shared->error);

  EngineDecodeRun run;
  run.metrics = engine->metrics();
  run.outputs = std::move(shared->tokens);
  Clock::time_point all_in = start, first_done = Clock::time_point::max(), last = start;
  for (const auto& t : shared->times) {
    if (t.empty()) return internal_error("engine decode: a request ended without a token");
    const int64_t n = static_cast<int64_t>(t.size());
    all_in = std::max(all_in, t[std::clamp<int64_t>(window.skip_tokens, 0, n - 1)]);
    first_done = std::min(first_done, t[std::clamp<int64_t>(n - 1 - window.tail_tokens, 0, n - 1)]);
    last = std::max(last, t.back());
  }
  for (const auto& t : shared->times)
    run.window_tokens += std::count_if(t.begin(), t.end(), [&](Clock::time_point x) { return x > all_in && x <= first_done; });
  run.window_seconds = std::chrono::duration<double>(first_done - all_in).count();
  run.tok_s = run.window_seconds > 0 ? static_cast<double>(run.window_tokens) / run.window_seconds : 0;
  run.seconds = std::chrono::duration<double>(last - start).count();
  return run;
}

}  // namespace kiln::cli
