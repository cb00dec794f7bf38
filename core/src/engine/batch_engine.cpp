#include "engine/batch_engine.h"

#include <algorithm>
#include <string>

#include "kiln/log.h"

namespace kiln {

Result<std::unique_ptr<BatchEngine>> BatchEngine::create(const EngineConfig& config,
                                                         std::unique_ptr<ModelRunner> runner) {
  KILN_RETURN_IF_ERROR(config.validate());
  if (!runner) return invalid_argument("engine: no model runner");
  if (runner->vocab_size() <= 0) return invalid_argument("engine: the model runner reports no vocabulary");
  std::unique_ptr<BatchEngine> engine(new BatchEngine(config, std::move(runner)));
  engine->thread_ = std::thread([e = engine.get()] { e->loop(); });
  return engine;
}

BatchEngine::BatchEngine(const EngineConfig& config, std::unique_ptr<ModelRunner> runner)
    : config_(config),
      runner_(std::move(runner)),
      blocks_(config.num_blocks, config.block_size, config.prefix_caching, config.lookahead_slots),
      scheduler_(config_, blocks_) {
  publish_metrics();
}

BatchEngine::~BatchEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<uint64_t> BatchEngine::submit(RequestParams params, TokenSink sink) {
  // check_fits reads only limits fixed at construction, so it runs on the caller's thread.
  KILN_RETURN_IF_ERROR(scheduler_.check_fits(params));
  const int64_t vocab = runner_->vocab_size();
  for (size_t i = 0; i < params.prompt.size(); ++i)
    if (params.prompt[i] < 0 || params.prompt[i] >= vocab)
      return invalid_argument("prompt token " + std::to_string(i) + " is " + std::to_string(params.prompt[i]) +
                              ", outside the vocabulary (size " + std::to_string(vocab) + ")");
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_ || stop_) return unavailable("the engine is shutting down and accepts no new requests");
    const int64_t queued = waiting_ + static_cast<int64_t>(inbox_.size());
    if (queued >= config_.max_waiting)
      return resource_exhausted("the engine is overloaded: " + std::to_string(queued) +
                                " requests are already waiting (limit " + std::to_string(config_.max_waiting) + ")");
    id = next_id_++;
    inbox_.push_back(std::make_unique<Sequence>(id, std::move(params), std::move(sink)));
    idle_now_ = false;
  }
  wake_.notify_one();
  return id;
}

void BatchEngine::cancel(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.push_back(request_id);
  }
  wake_.notify_one();
}

EngineMetrics BatchEngine::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineMetrics m = metrics_;
  m.requests_waiting += static_cast<int64_t>(inbox_.size());
  return m;
}

void BatchEngine::drain() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    draining_ = true;
    idle_.wait(lock, [&] { return stop_ || (idle_now_ && inbox_.empty()); });
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void BatchEngine::loop() {
  for (;;) {
    std::deque<std::unique_ptr<Sequence>> arrivals;
    std::vector<uint64_t> cancels;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || !scheduler_.empty(); });
      stopping = stop_;
      arrivals.swap(inbox_);
      cancels.swap(cancels_);
    }
    for (auto& seq : arrivals) scheduler_.add(std::move(seq));
    for (uint64_t id : cancels)
      if (Sequence* seq = scheduler_.find(id)) end(seq, FinishReason::kAbort);
    if (stopping) {
      for (Sequence* seq : scheduler_.all()) end(seq, FinishReason::kAbort);
      publish_metrics();
      return;
    }
    if (!scheduler_.empty()) step();
    publish_metrics();
  }
}

void BatchEngine::step() {
  const ScheduledStep plan = scheduler_.schedule();
  if (plan.chunks.empty()) return;  // only after a step that preempted everything; the next one admits
  steps_.clear();
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence* seq = c.seq;
    steps_.push_back(SequenceStep{std::span<const int32_t>(seq->tokens.data() + seq->num_computed, c.num_tokens),
                                  seq->num_computed, &seq->kv.blocks, false});
  }
  const int64_t vocab = runner_->vocab_size();
  Status status = runner_->forward(steps_, output_);
  if (status.ok() &&
      (output_.first_row.size() != steps_.size() || output_.logits.size() < steps_.size() * static_cast<size_t>(vocab)))
    status = internal_error("the model runner returned " + std::to_string(output_.first_row.size()) + " rows and " +
                            std::to_string(output_.logits.size()) + " logits for " + std::to_string(steps_.size()) +
                            " steps of vocabulary " + std::to_string(vocab));
  if (!status.ok()) {
    log::error("engine: forward pass over {} sequences failed: {}", steps_.size(), status.to_string());
    for (const ScheduledChunk& c : plan.chunks) end(c.seq, FinishReason::kError, status.to_string());
    return;
  }

  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    scheduler_.on_computed(plan.chunks[i]);
    Sequence* seq = plan.chunks[i].seq;
    if (seq->pending() > 0) continue;  // a prompt chunk with more to come
    const int32_t token = seq->sampler.next(output_.logits.data() + output_.first_row[i] * vocab, vocab);
    seq->tokens.push_back(token);
    if (seq->generated() == 1) prompt_tokens_total_ += seq->prompt_len;
    ++generation_tokens_total_;

    TokenEvent event;
    event.token = token;
    if (std::find(seq->stop_token_ids.begin(), seq->stop_token_ids.end(), token) != seq->stop_token_ids.end())
      event.finish_reason = FinishReason::kStop;
    else if (seq->generated() >= seq->max_tokens)
      event.finish_reason = FinishReason::kLength;
    event.finished = event.finish_reason != FinishReason::kNone;
    emit(seq, event);
  }
}

void BatchEngine::emit(Sequence* seq, const TokenEvent& partial) {
  TokenEvent event = partial;
  event.request_id = seq->id;
  event.prompt_tokens = seq->prompt_len;
  event.completion_tokens = seq->generated();
  event.cached_prompt_tokens = seq->cached_prompt_tokens;
  bool alive = true;
  if (seq->sink) {
    // The sink is the server's code: an exception from it must not take the engine thread down.
    try {
      alive = seq->sink(event);
    } catch (const std::exception& e) {
      log::error("engine: the token sink of request {} threw: {}", seq->id, e.what());
      alive = false;
    } catch (...) {
      alive = false;
    }
  }
  if (event.finished || !alive) scheduler_.finish(seq);
}

void BatchEngine::end(Sequence* seq, FinishReason reason, const std::string& error) {
  TokenEvent event;
  event.finished = true;
  event.finish_reason = reason;
  event.error = error;
  emit(seq, event);
}

void BatchEngine::publish_metrics() {
  const PrefixCacheStats prefix = blocks_.prefix_stats();
  std::lock_guard<std::mutex> lock(mutex_);
  metrics_.requests_running = scheduler_.num_running();
  metrics_.requests_waiting = scheduler_.num_waiting();
  metrics_.kv_blocks_total = blocks_.num_blocks();
  metrics_.kv_blocks_used = blocks_.used_blocks();
  metrics_.kv_block_size = blocks_.block_size();
  metrics_.prompt_tokens_total = prompt_tokens_total_;
  metrics_.generation_tokens_total = generation_tokens_total_;
  metrics_.prefix_cache_queries = prefix.queries;
  metrics_.prefix_cache_hits = prefix.hits;
  metrics_.preemptions_total = scheduler_.preemptions();
  metrics_.max_model_len = config_.max_model_len;
  waiting_ = scheduler_.num_waiting();
  idle_now_ = scheduler_.empty();
  if (idle_now_) idle_.notify_all();
}

}  // namespace kiln
