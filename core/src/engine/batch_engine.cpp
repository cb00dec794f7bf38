#include "engine/batch_engine.h"

#include <algorithm>
#include <string>

#include "engine/speculative_sampling.h"
#include "kiln/log.h"

namespace kiln {

Result<std::unique_ptr<BatchEngine>> BatchEngine::create(const EngineConfig& config,
                                                         std::unique_ptr<ModelRunner> runner,
                                                         std::shared_ptr<Drafter> drafter) {
  KILN_RETURN_IF_ERROR(config.validate());
  if (!runner) return invalid_argument("engine: no model runner");
  if (runner->vocab_size() <= 0) return invalid_argument("engine: the model runner reports no vocabulary");
  if (config.speculative_depth > 0) {
    if (!drafter) return invalid_argument("engine: speculative_depth > 0 needs a drafter");
    if (config.lookahead_slots < config.speculative_depth)
      return invalid_argument("engine: lookahead_slots (" + std::to_string(config.lookahead_slots) +
                              ") must cover speculative_depth (" + std::to_string(config.speculative_depth) + ")");
    if (config.speculative_depth > drafter->capabilities().max_depth)
      return invalid_argument("`speculative.depth` " + std::to_string(config.speculative_depth) +
                              " is beyond the drafter's maximum of " + std::to_string(drafter->capabilities().max_depth));
  }
  if (config.speculative_depth <= 0) drafter.reset();
  std::unique_ptr<BatchEngine> engine(new BatchEngine(config, std::move(runner), std::move(drafter)));
  engine->thread_ = std::thread([e = engine.get()] { e->loop(); });
  return engine;
}

BatchEngine::BatchEngine(const EngineConfig& config, std::unique_ptr<ModelRunner> runner,
                         std::shared_ptr<Drafter> drafter)
    : config_(config),
      runner_(std::move(runner)),
      blocks_(config.num_blocks, config.block_size, config.prefix_caching, config.lookahead_slots),
      scheduler_(config_, blocks_),
      drafter_(std::move(drafter)) {
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

Status BatchEngine::draft(const ScheduledStep& plan) {
  int64_t decoding = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence* seq = c.seq;
    // A preempted sequence recomputes from scratch: the drafter forgets it too (before this step's rows are
    // kept for it, whether or not this step drafts).
    if (seq->num_computed < seq->draft_start) {
      KILN_RETURN_IF_ERROR(drafter_->rollback(static_cast<int64_t>(seq->id), 0));
      seq->draft_start = 0;
      seq->draft_hidden.clear();
    }
    decoding += c.num_tokens == 1 && seq->pending() == 1;
  }
  // Too many decoding sequences for drafting to pay: plain decoding. The drafter catches up at its next step
  // from the rows kept meanwhile in draft_hidden.
  if (config_.speculative_max_batch > 0 && decoding > config_.speculative_max_batch) return ok_status();
  std::vector<DraftInput> inputs;
  std::vector<size_t> which;  // chunk index of each input
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    Sequence* seq = plan.chunks[i].seq;
    // Only decodes draft: the chunk is the one uncomputed newest token t_L.
    if (plan.chunks[i].num_tokens != 1 || seq->pending() != 1 || seq->generated() < 1) continue;
    // Each pass emits at least one token; never draft past max_tokens or the context limit.
    const int64_t remaining = std::min(seq->max_tokens - seq->generated(),
                                       config_.max_model_len - static_cast<int64_t>(seq->tokens.size()));
    const int64_t k = std::min<int64_t>(config_.speculative_depth, remaining - 1);
    if (k <= 0) continue;
    DraftInput in;
    in.seq_id = static_cast<int64_t>(seq->id);
    in.start_position = seq->draft_start;
    in.tokens = seq->tokens.data() + seq->draft_start;
    in.num_tokens = seq->num_computed - seq->draft_start;
    in.target_hidden = seq->draft_hidden.data();
    in.next_token = seq->tokens.back();
    in.temperature = seq->sampler.greedy() ? 0.0f : seq->sampler.options().temperature;
    in.seed = seq->sampler.options().seed;
    inputs.push_back(in);
    which.push_back(i);
    seq->drafter_knows = true;
  }
  if (inputs.empty()) return ok_status();
  // One depth for the batch; sequences near their limits take fewer of the drafts.
  int depth = 0;
  for (size_t b = 0; b < inputs.size(); ++b) {
    Sequence* seq = plan.chunks[which[b]].seq;
    const int64_t remaining = std::min(seq->max_tokens - seq->generated(),
                                       config_.max_model_len - static_cast<int64_t>(seq->tokens.size()));
    depth = std::max<int>(depth, static_cast<int>(std::min<int64_t>(config_.speculative_depth, remaining - 1)));
  }
  std::vector<DraftOutput> out;
  KILN_RETURN_IF_ERROR(drafter_->propose(inputs, depth, out));
  if (out.size() != inputs.size()) return internal_error("the drafter answered " + std::to_string(out.size()) +
                                                         " of " + std::to_string(inputs.size()) + " sequences");
  for (size_t b = 0; b < inputs.size(); ++b) {
    const size_t i = which[b];
    Sequence* seq = plan.chunks[i].seq;
    // The drafter has now seen every computed row.
    seq->draft_start = seq->num_computed;
    seq->draft_hidden.clear();
    const int64_t remaining = std::min(seq->max_tokens - seq->generated(),
                                       config_.max_model_len - static_cast<int64_t>(seq->tokens.size()));
    const int64_t k = std::min<int64_t>({config_.speculative_depth, remaining - 1,
                                         static_cast<int64_t>(out[b].tokens.size())});
    drafts_[i] = std::move(out[b]);
    drafts_[i].tokens.resize(k);
    verify_tokens_[i].assign(1, seq->tokens.back());
    verify_tokens_[i].insert(verify_tokens_[i].end(), drafts_[i].tokens.begin(), drafts_[i].tokens.end());
  }
  return ok_status();
}

void BatchEngine::step() {
  const ScheduledStep plan = scheduler_.schedule();
  if (plan.chunks.empty()) return;  // only after a step that preempted everything; the next one admits
  const size_t n = plan.chunks.size();
  verify_tokens_.assign(n, {});
  drafts_.assign(n, {});
  if (drafter_) {
    Status s = draft(plan);
    if (!s.ok()) {
      log::error("engine: drafting failed: {}", s.to_string());
      for (const ScheduledChunk& c : plan.chunks) end(c.seq, FinishReason::kError, "drafter: " + s.to_string());
      return;
    }
  }
  steps_.clear();
  for (size_t i = 0; i < n; ++i) {
    Sequence* seq = plan.chunks[i].seq;
    if (!verify_tokens_[i].empty())
      steps_.push_back(SequenceStep{verify_tokens_[i], seq->num_computed, &seq->kv.blocks, /*all_logits=*/true});
    else
      steps_.push_back(SequenceStep{std::span<const int32_t>(seq->tokens.data() + seq->num_computed,
                                                             plan.chunks[i].num_tokens),
                                    seq->num_computed, &seq->kv.blocks, false});
  }
  const int64_t vocab = runner_->vocab_size();
  Status status = runner_->forward(steps_, output_, /*keep_hidden=*/drafter_ != nullptr);
  if (status.ok() &&
      (output_.first_row.size() != steps_.size() || output_.logits.size() < steps_.size() * static_cast<size_t>(vocab)))
    status = internal_error("the model runner returned " + std::to_string(output_.first_row.size()) + " rows and " +
                            std::to_string(output_.logits.size()) + " logits for " + std::to_string(steps_.size()) +
                            " steps of vocabulary " + std::to_string(vocab));
  int64_t hidden_size = 0;
  if (status.ok() && drafter_) {
    int64_t tokens = 0;
    for (const auto& st : steps_) tokens += static_cast<int64_t>(st.tokens.size());
    hidden_size = tokens > 0 ? static_cast<int64_t>(output_.hidden.size()) / tokens : 0;
    if (hidden_size <= 0 || static_cast<int64_t>(output_.hidden.size()) != tokens * hidden_size)
      status = internal_error("the model runner returned no hidden states for the drafter");
  }
  if (!status.ok()) {
    log::error("engine: forward pass over {} sequences failed: {}", steps_.size(), status.to_string());
    for (const ScheduledChunk& c : plan.chunks) end(c.seq, FinishReason::kError, status.to_string());
    return;
  }

  int64_t row = 0;  // first hidden row of chunk i
  for (size_t i = 0; i < n; ++i) {
    Sequence* seq = plan.chunks[i].seq;
    const int64_t chunk_rows = static_cast<int64_t>(steps_[i].tokens.size());
    const float* hidden = drafter_ ? output_.hidden.data() + row * hidden_size : nullptr;
    row += chunk_rows;
    const float* logits = output_.logits.data() + output_.first_row[i] * vocab;

    if (verify_tokens_[i].empty()) {
      scheduler_.on_computed(plan.chunks[i]);
      if (hidden) seq->draft_hidden.insert(seq->draft_hidden.end(), hidden, hidden + chunk_rows * hidden_size);
      if (seq->pending() > 0) continue;  // a prompt chunk with more to come
      emit_token(seq, seq->sampler.next(logits, vocab));
      continue;
    }

    // Verification of t_L and K drafts: accept a prefix, then the target's correction or bonus token.
    const std::vector<int32_t>& pass = verify_tokens_[i];
    const int64_t k = static_cast<int64_t>(pass.size()) - 1;
    std::span<const int32_t> drafted(pass.data() + 1, k);
    const DraftOutput& d = drafts_[i];
    const bool have_q = !seq->sampler.greedy() && static_cast<int64_t>(d.probs.size()) == k * vocab;
    Verification v = seq->sampler.greedy()
                         ? verify_greedy(logits, vocab, drafted)
                         : verify_sampling(logits, vocab, drafted, have_q ? d.probs.data() : nullptr,
                                           seq->sampler.params(), seq->sampler.rng());
    spec_.record(k, v.accepted);
    // The target's rows L .. L + a are now valid; rows beyond were written but are overwritten before any
    // query reads them (the next pass starts at L + a + 1 and writes before it attends).
    const int64_t a = v.accepted;
    seq->tokens.insert(seq->tokens.end(), pass.begin() + 1, pass.begin() + 1 + a);
    scheduler_.on_computed(ScheduledChunk{seq, a + 1});
    seq->draft_hidden.assign(hidden, hidden + (a + 1) * hidden_size);
    if (Status r = drafter_->rollback(static_cast<int64_t>(seq->id), seq->num_computed); !r.ok()) {
      end(seq, FinishReason::kError, "drafter rollback: " + r.to_string());
      continue;
    }
    // Emit the accepted drafts (already in tokens, counted from where they stand) and then the correction or
    // bonus token.
    bool alive = true;
    const int64_t before = seq->generated() - a;
    for (int64_t t = 0; t < a && alive; ++t) alive = emit_accepted(seq, v.tokens[t], before + t + 1);
    if (alive) emit_token(seq, v.tokens.back());
  }
}

bool BatchEngine::emit_token(Sequence* seq, int32_t token) {
  seq->tokens.push_back(token);
  return emit_accepted(seq, token, seq->generated());
}

bool BatchEngine::emit_accepted(Sequence* seq, int32_t token, int64_t completion_tokens) {
  if (completion_tokens == 1) prompt_tokens_total_ += seq->prompt_len;
  ++generation_tokens_total_;
  TokenEvent event;
  event.token = token;
  event.completion_tokens = completion_tokens;
  if (std::find(seq->stop_token_ids.begin(), seq->stop_token_ids.end(), token) != seq->stop_token_ids.end())
    event.finish_reason = FinishReason::kStop;
  else if (completion_tokens >= seq->max_tokens)
    event.finish_reason = FinishReason::kLength;
  event.finished = event.finish_reason != FinishReason::kNone;
  return emit(seq, event);
}

bool BatchEngine::emit(Sequence* seq, const TokenEvent& partial) {
  TokenEvent event = partial;
  event.request_id = seq->id;
  event.prompt_tokens = seq->prompt_len;
  if (event.completion_tokens == 0) event.completion_tokens = seq->generated();
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
  if (event.finished || !alive) {
    if (drafter_ && seq->drafter_knows) drafter_->release(static_cast<int64_t>(seq->id));
    scheduler_.finish(seq);
    return false;
  }
  return true;
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
  metrics_.spec_drafts = spec_.drafts;
  metrics_.spec_draft_tokens = spec_.drafted;
  metrics_.spec_accepted_tokens = spec_.accepted;
  metrics_.spec_drafted_per_pos = spec_.drafted_at;
  metrics_.spec_accepted_per_pos = spec_.accepted_at;
  waiting_ = scheduler_.num_waiting();
  idle_now_ = scheduler_.empty();
  if (idle_now_) idle_.notify_all();
}

}  // namespace kiln
