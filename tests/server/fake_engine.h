// A deterministic stand-in for kiln::Engine: each submitted request replays a scripted token list on the engine
// thread (one token per request per tick), honouring max_tokens, stop ids, cancel() and sinks that refuse.
// It records what it was asked and what it freed, so tests can assert the server's side of the contract.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "engine/engine_api.h"

namespace kiln::testing {

class FakeEngine : public Engine {
 public:
  explicit FakeEngine(std::chrono::milliseconds tick = std::chrono::milliseconds(1)) : tick_(tick) {
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() override {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  // The next submitted request generates these tokens (then the default reply).
  void script(std::vector<int32_t> tokens) {
    std::lock_guard lock(mutex_);
    scripts_.push_back(std::move(tokens));
  }
  void set_default_reply(std::vector<int32_t> tokens) {
    std::lock_guard lock(mutex_);
    default_reply_ = std::move(tokens);
  }
  // The next submit() fails with this status.
  void refuse_next(Status status) {
    std::lock_guard lock(mutex_);
    refusal_ = std::move(status);
  }
  // The next submitted request ends with an engine error (kError with why's kind) after its scripted tokens, as a
  // failed step ends the sequences in it.
  void fail_next(Status why) {
    std::lock_guard lock(mutex_);
    failure_ = std::move(why);
  }
  void set_cached_prompt_tokens(int64_t n) { cached_ = n; }
  // Each later request "prefills" for this long before its first token, in `chunks` equal chunks; one that asked
  // for prefill progress hears of each chunk but the last.
  void set_prefill_time(std::chrono::milliseconds time, int chunks = 4) {
    std::lock_guard lock(mutex_);
    prefill_time_ = time;
    prefill_chunks_ = chunks;
  }

  Result<uint64_t> submit(RequestParams params, TokenSink sink) override {
    std::lock_guard lock(mutex_);
    if (!refusal_.ok()) {
      Status s = refusal_;
      refusal_ = Status();
      return s;
    }
    if (draining_) return unavailable("engine is draining");
    uint64_t id = next_id_++;
    Active a;
    a.params = params;
    a.sink = std::move(sink);
    a.submitted = std::chrono::steady_clock::now();
    a.failure = failure_;
    failure_ = Status();
    if (!scripts_.empty()) {
      a.tokens = std::move(scripts_.front());
      scripts_.pop_front();
    } else {
      a.tokens = default_reply_;
    }
    submitted_.push_back(params);
    prompt_tokens_total_ += static_cast<int64_t>(params.prompt.size());
    active_.emplace(id, std::move(a));
    wake_.notify_all();
    return id;
  }

  void cancel(uint64_t id) override {
    std::lock_guard lock(mutex_);
    cancelled_.insert(id);
    active_.erase(id);
    changed_.notify_all();
  }

  EngineMetrics metrics() const override {
    std::lock_guard lock(mutex_);
    EngineMetrics m;
    m.requests_running = static_cast<int64_t>(active_.size());
    m.kv_blocks_total = 100;
    m.kv_blocks_used = static_cast<int64_t>(active_.size());
    m.kv_block_size = 64;
    m.prompt_tokens_total = prompt_tokens_total_;
    m.generation_tokens_total = generation_tokens_total_;
    m.prefix_cache_queries = prompt_tokens_total_;
    m.prefix_cache_hits = cached_;
    m.max_model_len = 4096;
    return m;
  }

  void drain() override {
    std::unique_lock lock(mutex_);
    draining_ = true;
    drained_calls_++;
    changed_.wait(lock, [&] { return active_.empty(); });
    // Admits again once drained, so a test can put a second server in front of the same engine.
    draining_ = false;
  }

  // Waits until the engine no longer holds any request (finished, cancelled or refused by its sink).
  bool wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return active_.empty(); });
  }
  std::set<uint64_t> cancelled() const {
    std::lock_guard lock(mutex_);
    return cancelled_;
  }
  int sink_refusals() const { return sink_refusals_; }
  int drain_calls() const {
    std::lock_guard lock(mutex_);
    return drained_calls_;
  }
  std::vector<RequestParams> submitted() const {
    std::lock_guard lock(mutex_);
    return submitted_;
  }

 private:
  struct Active {
    RequestParams params;
    TokenSink sink;
    std::vector<int32_t> tokens;
    size_t next = 0;
    std::chrono::steady_clock::time_point submitted;
    int chunks_done = 0;
    Status failure;  // ends with this error once its tokens are out
  };

  void loop() {
    std::unique_lock lock(mutex_);
    while (!quit_) {
      wake_.wait_for(lock, tick_, [&] { return quit_ || !active_.empty(); });
      if (quit_) break;
      std::vector<uint64_t> done;
      for (auto& [id, a] : active_) {
        TokenEvent ev;
        ev.request_id = id;
        ev.prompt_tokens = static_cast<int64_t>(a.params.prompt.size());
        ev.cached_prompt_tokens = cached_;
        if (a.chunks_done < prefill_chunks_ && prefill_time_.count() > 0) {
          const auto chunk_end = a.submitted + prefill_time_ * (a.chunks_done + 1) / prefill_chunks_;
          if (std::chrono::steady_clock::now() < chunk_end) continue;
          if (++a.chunks_done == prefill_chunks_ || !a.params.report_prefill_progress) continue;
          ev.prefilled_tokens = std::max<int64_t>(1, ev.prompt_tokens * a.chunks_done / prefill_chunks_);
          if (!a.sink(ev)) {
            ++sink_refusals_;
            done.push_back(id);
          }
          continue;
        }
        if (a.next < a.tokens.size()) {
          ev.token = a.tokens[a.next++];
          ev.completion_tokens = static_cast<int64_t>(a.next);
          ++generation_tokens_total_;
          const auto& stops = a.params.stop_token_ids;
          if (std::find(stops.begin(), stops.end(), ev.token) != stops.end()) {
            ev.finished = true;
            ev.finish_reason = FinishReason::kStop;
          } else if (static_cast<int64_t>(a.next) >= a.params.max_tokens) {
            ev.finished = true;
            ev.finish_reason = FinishReason::kLength;
          } else if (a.next == a.tokens.size() && a.failure.ok()) {
            ev.finished = true;
            ev.finish_reason = FinishReason::kStop;
          }
        } else if (!a.failure.ok()) {
          ev.finished = true;
          ev.finish_reason = FinishReason::kError;
          ev.error = a.failure.to_string();
          ev.error_code = a.failure.code();
          ev.completion_tokens = static_cast<int64_t>(a.next);
        } else {
          ev.finished = true;
          ev.finish_reason = FinishReason::kStop;
          ev.completion_tokens = static_cast<int64_t>(a.next);
        }
        // Sinks run on the engine thread, as in the real engine.
        if (!a.sink(ev)) {
          ++sink_refusals_;
          done.push_back(id);
        } else if (ev.finished) {
          done.push_back(id);
        }
      }
      for (uint64_t id : done) active_.erase(id);
      if (!done.empty()) changed_.notify_all();
      lock.unlock();
      std::this_thread::sleep_for(tick_);
      lock.lock();
    }
  }

  std::chrono::milliseconds tick_;
  std::chrono::milliseconds prefill_time_{0};
  int prefill_chunks_ = 4;
  mutable std::mutex mutex_;
  std::condition_variable wake_, changed_;
  std::thread thread_;
  bool quit_ = false, draining_ = false;
  int drained_calls_ = 0;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Active> active_;
  std::deque<std::vector<int32_t>> scripts_;
  std::vector<int32_t> default_reply_;
  Status refusal_;
  Status failure_;  // for the next submitted request (fail_next)
  std::set<uint64_t> cancelled_;
  std::vector<RequestParams> submitted_;
  std::atomic<int> sink_refusals_{0};
  std::atomic<int64_t> cached_{0};
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0;
};

}  // namespace kiln::testing
