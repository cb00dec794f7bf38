// The serving engine: one loop thread batches every running sequence into each forward pass
// (continuous batching, scheduler.h), samples each sequence from its own logits row with its own Sampler,
// and streams TokenEvents to each request's sink on that thread. submit/cancel/metrics/drain are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/block_manager.h"
#include "engine/engine_api.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"

namespace kiln {

class BatchEngine final : public Engine {
 public:
  // Validates the config and starts the loop thread. The runner's KV pool must have config.num_blocks
  // blocks of config.block_size tokens (the engine hands out their ids).
  static Result<std::unique_ptr<BatchEngine>> create(const EngineConfig& config, std::unique_ptr<ModelRunner> runner);
  // Aborts whatever is still queued or running (kAbort events) and joins the loop.
  ~BatchEngine() override;

  Result<uint64_t> submit(RequestParams params, TokenSink sink) override;
  // The request ends with a kAbort event and its blocks are freed at the next step boundary.
  void cancel(uint64_t request_id) override;
  EngineMetrics metrics() const override;
  // Refuses new requests (kUnavailable), runs the queued and running ones to completion, stops the loop.
  void drain() override;

  const EngineConfig& config() const { return config_; }

 private:
  BatchEngine(const EngineConfig& config, std::unique_ptr<ModelRunner> runner);
  void loop();
  void step();
  // Delivers an event; a false return (consumer gone) or a final event ends the sequence at once.
  void emit(Sequence* seq, const TokenEvent& event);
  void end(Sequence* seq, FinishReason reason, const std::string& error = "");
  void publish_metrics();

  const EngineConfig config_;
  std::unique_ptr<ModelRunner> runner_;
  BlockManager blocks_;
  Scheduler scheduler_;  // touched by the loop thread only
  StepOutput output_;
  std::vector<SequenceStep> steps_;

  // Hand-over from other threads to the loop.
  mutable std::mutex mutex_;
  std::condition_variable wake_;  // the loop: work arrived or stop
  std::condition_variable idle_;  // drain(): the loop has nothing left
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  bool draining_ = false, stop_ = false, idle_now_ = true;
  int64_t waiting_ = 0;  // scheduler's waiting count as of the last step, for the queue bound
  EngineMetrics metrics_;
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0;  // loop thread's running totals

  std::thread thread_;
};

}  // namespace kiln
