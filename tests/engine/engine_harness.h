// Builds a BatchEngine over the fake runner and collects each request's events.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "engine/batch_engine.h"
#include "fake_model_runner.h"

namespace kiln::testing {

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<TokenEvent> events;
  bool done = false;
  FinishReason reason = FinishReason::kNone;
  int64_t calls_after_final = 0;  // sink calls after the one that ended it (must stay 0)
};

class Collector {
 public:
  // A sink for request `key`; it reports the consumer gone once `disconnect_after` tokens arrived (0 = never).
  TokenSink sink(int key, int64_t disconnect_after = 0) {
    return [this, key, disconnect_after](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      Outcome& o = outcomes_[key];
      if (o.done) {
        ++o.calls_after_final;
        return false;
      }
      o.events.push_back(e);
      if (e.token >= 0) o.tokens.push_back(e.token);
      const bool gone = disconnect_after > 0 && static_cast<int64_t>(o.tokens.size()) >= disconnect_after;
      if (e.finished || gone) {
        o.done = true;
        o.reason = e.finished ? e.finish_reason : FinishReason::kAbort;
        cv_.notify_all();
      }
      return !gone;
    };
  }
  bool wait(int key, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return outcomes_[key].done; });
  }
  Outcome get(int key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return outcomes_[key];
  }
  int64_t tokens_so_far(int key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(outcomes_[key].tokens.size());
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int, Outcome> outcomes_;
};

inline EngineConfig small_config(int64_t num_blocks, int64_t block_size = 4) {
  EngineConfig c;
  c.max_model_len = 512;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.max_waiting = 1024;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  return c;
}

struct EngineUnderTest {
  FakeModelRunner* runner = nullptr;  // owned by the engine
  std::unique_ptr<BatchEngine> engine;
};

inline EngineUnderTest make_engine(const EngineConfig& config, int64_t vocab = 97) {
  auto runner = std::make_unique<FakeModelRunner>(config.num_blocks, config.block_size, vocab);
  EngineUnderTest t;
  t.runner = runner.get();
  auto engine = BatchEngine::create(config, std::move(runner));
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (engine.ok()) t.engine = std::move(engine).value();
  return t;
}

// Waits until the engine has neither running nor waiting requests.
inline EngineMetrics wait_idle(const Engine& engine) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  EngineMetrics m = engine.metrics();
  while ((m.requests_running > 0 || m.requests_waiting > 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    m = engine.metrics();
  }
  return m;
}

// Submits every prompt at once (request i: prompts[i], max_tokens lengths[i]) and waits for all of them; the
// outcomes in request order (empty when a submit fails, which is reported).
inline std::vector<Outcome> run_requests(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                         const std::vector<int64_t>& lengths) {
  Collector c;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = lengths[i];
    const auto submitted = engine.submit(p, c.sink(static_cast<int>(i)));
    EXPECT_TRUE(submitted.ok()) << submitted.status().to_string();
    if (!submitted.ok()) return {};
  }
  std::vector<Outcome> outcomes;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(c.wait(static_cast<int>(i)));
    outcomes.push_back(c.get(static_cast<int>(i)));
  }
  return outcomes;
}

inline std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t len, int64_t vocab) {
  std::uniform_int_distribution<int32_t> tok(1, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(len);
  for (auto& t : p) t = tok(rng);
  return p;
}

}  // namespace kiln::testing
