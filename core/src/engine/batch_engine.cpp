#include "engine/batch_engine.h"

#include <algorithm>
#include <string>

#include "kiln/log.h"

namespace kiln {

Result<EngineConfig> apply_batch_invariance(const EngineConfig& config, const BatchInvariance& bound) {
  if (!config.batch_invariant) return config;
  if (!bound.bounded()) {
    log::info("scheduler.batch_invariant: the model runner is batch-invariant at any step size; no limit applied");
    return config;
  }
  EngineConfig c = config;
  const int64_t rows = std::min(bound.rows, bound.logit_rows);  // every chunk brings a logit row
  if (rows < 1 || bound.chunk_rows < 1)
    return invalid_argument("scheduler.batch_invariant: the model runner promises no batch-invariant rows (its "
                            "weight format's kernels follow the batch), so no step could keep it");
  c.max_num_batched_tokens = std::min(c.max_num_batched_tokens, rows);
  c.lone_prompt_tokens = 0;  // a lone prompt's step keeps the bound too
  c.max_chunk_tokens = c.max_chunk_tokens > 0 ? std::min(c.max_chunk_tokens, bound.chunk_rows) : bound.chunk_rows;
  if (c.max_num_seqs > c.max_num_batched_tokens)
    return invalid_argument("scheduler.batch_invariant: the model runner's steps are batch-invariant up to " +
                            std::to_string(c.max_num_batched_tokens) + " rows, fewer than scheduler.max_num_seqs (" +
                            std::to_string(c.max_num_seqs) + ") decoding sequences; set max_num_seqs to at most " +
                            std::to_string(c.max_num_batched_tokens));
  log::info("scheduler.batch_invariant: steps of at most {} tokens, prompt chunks of at most {} (the model runner's "
            "bound; max_num_batched_tokens was {})",
            c.max_num_batched_tokens, c.max_chunk_tokens, config.max_num_batched_tokens);
  return c;
}

Result<std::unique_ptr<BatchEngine>> BatchEngine::create(const EngineConfig& config,
                                                         std::unique_ptr<ModelRunner> runner,
                                                         std::shared_ptr<Drafter> drafter,
                                                         std::shared_ptr<CacheManager> caches) {
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
  if (caches) {
    if (caches->blocks().num_blocks() != config.num_blocks || caches->blocks().block_size() != config.block_size)
      return invalid_argument("engine: the cache manager's pool (" + std::to_string(caches->blocks().num_blocks()) +
                              " blocks of " + std::to_string(caches->blocks().block_size()) +
                              ") is not the config's (" + std::to_string(config.num_blocks) + " of " +
                              std::to_string(config.block_size) + ")");
  } else {
    CacheManagerConfig cm;
    cm.num_blocks = config.num_blocks, cm.block_size = config.block_size, cm.prefix_caching = config.prefix_caching;
    cm.lookahead_slots = config.lookahead_slots, cm.state_slots = config.max_num_seqs;
    KILN_ASSIGN_OR_RETURN(caches, CacheManager::create(CacheSpec{}, nullptr, nullptr, cm));
  }
  KILN_ASSIGN_OR_RETURN(const EngineConfig applied, apply_batch_invariance(config, runner->batch_invariance()));
  std::unique_ptr<BatchEngine> engine(
      new BatchEngine(applied, std::move(runner), std::move(drafter), std::move(caches)));
  engine->thread_ = std::thread([e = engine.get()] { e->loop(); });
  return engine;
}

BatchEngine::BatchEngine(const EngineConfig& config, std::unique_ptr<ModelRunner> runner,
                         std::shared_ptr<Drafter> drafter, std::shared_ptr<CacheManager> caches)
    : config_(config),
      runner_(std::move(runner)),
      caches_(std::move(caches)),
      scheduler_(config_, *caches_),
      drafter_(std::move(drafter)),
      bound_(runner_->batch_invariance()) {
  if (drafter_) {
    options_.tap_layers = drafter_->capabilities().tap_layers;
    if (bound_.bounded()) {
      const int64_t k = config_.speculative_depth;
      // Sequences that can verify depth K together, and 1 draft each (fair_draft_depth with no prompt chunk).
      auto fits = [&](int64_t d) {
        int64_t n = 0;
        while (n < config_.max_num_seqs && fair_draft_depth(k, n + 1, n + 1, {}, bound_) >= d) ++n;
        return n;
      };
      if (fits(1) == 0)
        log::warn("speculative decoding stays off: the model runner's steps are batch-invariant only up to {} rows "
                  "({} with logits; a weight format that promises no bound gives 0), fewer than one verification "
                  "pass needs, so no pass could be lossless",
                  bound_.rows, bound_.logit_rows);
      else
        log::info("speculative decoding within the runner's batch-invariance bound ({} rows, {} with logits): depth "
                  "{} for up to {} decoding sequences, shallower beyond, none past {}",
                  bound_.rows, bound_.logit_rows, k, fits(k), fits(1));
    }
  }
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
  KILN_RETURN_IF_ERROR(check_media(params));
  if (params.logprobs > kMaxTopLogprobs)
    return invalid_argument("logprobs: at most " + std::to_string(kMaxTopLogprobs) + " alternatives, got " +
                            std::to_string(params.logprobs));
  if (params.logprobs >= 0 && !runner_->reports_logprobs())
    return invalid_argument("logprobs are not computed by this engine's model runner");
  if ((params.sampling.adjusts_logits() || params.sampling.min_p > 0.0f) && !runner_->applies_logit_adjustments())
    return invalid_argument("presence/frequency/repetition penalties, logit_bias and min_p are not applied by this "
                            "engine's model runner");
  for (const auto& [token, value] : params.sampling.logit_bias)
    if (token < 0 || token >= vocab)
      return invalid_argument("logit_bias: token " + std::to_string(token) + " is outside the vocabulary (size " +
                              std::to_string(vocab) + ")");
  if (!(params.sampling.repetition_penalty > 0.0f))
    return invalid_argument("repetition_penalty must be positive");
  if (params.constraint && !runner_->applies_token_masks())
    return invalid_argument("constrained decoding runs on the CPU only for now: this model's device selects tokens "
                            "without grammar masks");
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

// Media spans must lie inside the prompt, in order without overlapping, with their placeholders inside the span and
// one embedding row of the model's width per placeholder: the step scatters exactly those rows.
Status BatchEngine::check_media(const RequestParams& p) const {
  if (p.media.empty()) return ok_status();
  const int64_t hidden = runner_->hidden_size(), prompt = static_cast<int64_t>(p.prompt.size());
  if (hidden <= 0) return invalid_argument("this model takes no media");
  int64_t end = 0;
  for (size_t i = 0; i < p.media.size(); ++i) {
    const RequestMedia& m = p.media[i];
    const std::string what = "media item " + std::to_string(i);
    if (m.length <= 0 || m.position < end || m.position + m.length > prompt)
      return invalid_argument(what + ": tokens [" + std::to_string(m.position) + ", " +
                              std::to_string(m.position + m.length) + ") are not inside the prompt (" +
                              std::to_string(prompt) + " tokens) after the previous item");
    if (m.first_placeholder < 0 || m.num_embeddings < 0 || m.first_placeholder + m.num_embeddings > m.length)
      return invalid_argument(what + ": placeholders [" + std::to_string(m.first_placeholder) + ", " +
                              std::to_string(m.first_placeholder + m.num_embeddings) + ") exceed its " +
                              std::to_string(m.length) + " tokens");
    if (static_cast<int64_t>(m.embeddings.size()) != m.num_embeddings * hidden)
      return invalid_argument(what + ": " + std::to_string(m.embeddings.size()) + " embedding values for " +
                              std::to_string(m.num_embeddings) + " rows of width " + std::to_string(hidden));
    end = m.position + m.length;
  }
  return ok_status();
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

int64_t BatchEngine::draft_budget(const Sequence& seq) const {
  // Each pass emits at least one token; never draft past max_tokens or the context limit.
  const int64_t remaining = std::min(seq.max_tokens - seq.generated(),
                                     config_.max_model_len - static_cast<int64_t>(seq.tokens.size()));
  return std::max<int64_t>(std::min<int64_t>(config_.speculative_depth, remaining - 1), 0);
}

// Drafts a decoding chunk could verify now: what the drafter proposed, within the sequence's limits.
int64_t BatchEngine::drafts_ready(const ScheduledChunk& chunk) const {
  const Sequence& seq = *chunk.seq;
  if (chunk.num_tokens != 1 || seq.pending() != 1) return 0;
  return std::min<int64_t>(static_cast<int64_t>(seq.drafts.size()), draft_budget(seq));
}

int64_t BatchEngine::verification_depth(const ScheduledStep& plan) {
  // The pass verifies inside the runner's batch-invariance bound (draft_depth.h). The proposals were sized for the
  // chunks the scheduler expected; when others came (an arrival, a forecast that missed), the drafts shrink to fit,
  // or the step runs without them. Prompt chunks never wait for drafts: a second pass in the same step would need a
  // second drafter call over its rows, which ends the validity of the q the first one returned (drafter.h), and a
  // chunk deferred behind verifying passes delays its request's first token for as long as others keep drafting.
  // Dropping the drafts instead runs exactly the pass undrafted decoding runs there.
  int64_t decoding = 0, drafting = 0, wanted = 0;
  PassRows chunks;
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.num_tokens == 1 && c.seq->pending() == 1) {
      ++decoding;
      const int64_t k = drafts_ready(c);
      drafting += k > 0;
      wanted = std::max(wanted, k);
    } else {
      chunks.rows += c.num_tokens;
      chunks.logit_rows += 1;
    }
  }
  const int64_t depth = fair_draft_depth(config_.speculative_depth, decoding, drafting, chunks, bound_);
  if (depth < wanted && !bound_counted_) ++spec_.bound_limited_steps;
  bound_counted_ = false;
  return depth;
}

void BatchEngine::build_step(const ScheduledStep& plan) {
  const size_t n = plan.chunks.size();
  const int64_t depth = drafter_ ? verification_depth(plan) : 0;
  steps_.clear();
  select_.assign(n, {});
  verify_tokens_.assign(n, {});
  media_rows_.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    Sequence* seq = plan.chunks[i].seq;
    const int64_t count = plan.chunks[i].num_tokens, from = seq->num_computed;
    TokenSelection& sel = select_[i];
    int64_t k = std::min(drafts_ready(plan.chunks[i]), depth);
    // A chunk that computes everything pending yields the sequence's next token.
    sel.select = seq->pending() == count;
    if (sel.select && seq->constraint) k = constrain(*seq, k);
    if (k > 0) {
      std::vector<int32_t>& pass = verify_tokens_[i];
      pass.assign(1, seq->tokens.back());
      pass.insert(pass.end(), seq->drafts.begin(), seq->drafts.begin() + k);
      steps_.push_back(SequenceStep{pass, from, &seq->kv.blocks, /*all_logits=*/true, seq->state_slot, {}});
      steps_.back().prompt_length = seq->prompt_len;
      sel.num_drafts = static_cast<int32_t>(k);
      sel.drafts = std::span<const int32_t>(pass.data() + 1, k);
      sel.q_ids = seq->q_ids, sel.q_probs = seq->q_probs, sel.q_width = seq->q_width;
    } else {
      steps_.push_back(SequenceStep{std::span<const int32_t>(seq->tokens.data() + from, count), from, &seq->kv.blocks,
                                    false, seq->state_slot, {}});
      steps_.back().prompt_length = seq->prompt_len;
    }
    seq->drafts.clear();
    // Media placeholders inside this chunk take their embedding rows.
    for (const RequestMedia& m : seq->media) {
      if (m.num_embeddings <= 0) continue;
      const int64_t first = m.position + m.first_placeholder, last = first + m.num_embeddings;
      const int64_t lo = std::max(first, from), hi = std::min(last, from + count);
      if (lo >= hi) continue;
      const int64_t hidden = static_cast<int64_t>(m.embeddings.size()) / m.num_embeddings;
      media_rows_[i].push_back({lo - from, hi - lo, m.embeddings.data() + (lo - first) * hidden});
    }
    steps_.back().media = media_rows_[i];
    if (!sel.select) continue;
    if (seq->constraint) sel.allowed = seq->allowed;
    if (seq->penalties) {
      seq->penalties->follow(seq->tokens, seq->prompt_len);
      seq->penalties->fill(sel.drafts, seq->adjustments, seq->adjustment_offsets);
      sel.adjustments = seq->adjustments;
      sel.adjustment_offsets = seq->adjustment_offsets;
    }
    const SamplingOptions& o = seq->sampler.options();
    sel.min_p = o.min_p;
    sel.temperature = seq->sampler.greedy() ? 0.0f : o.temperature;
    sel.top_k = static_cast<int32_t>(std::min<int64_t>(o.top_k, INT32_MAX));
    sel.top_p = o.top_p;
    sel.logprobs = seq->logprobs;
    if (!seq->sampler.greedy())
      for (int64_t u = 0; u <= k; ++u) sel.uniforms.push_back(seq->sampler.uniform());
  }
}

int64_t BatchEngine::constrain(Sequence& seq, int64_t k) {
  const int64_t words = token_mask_words(runner_->vocab_size()), vocab = runner_->vocab_size();
  seq.allowed.assign((k + 1) * words, 0u);
  TokenConstraint& c = *seq.constraint;
  c.fill_allowed(std::span<uint32_t>(seq.allowed.data(), words));
  // Row t's mask is the constraint's state after the drafts before it, exactly as if they had been accepted one step
  // at a time: verified output equals undrafted output. A draft the constraint refuses would be rejected at its row
  // anyway, so the pass ends before it; so does a draft that completes the text (a stop token), which needs no row
  // after it. The constraint is then stepped back: it follows only what the step accepts.
  int64_t fed = 0;
  for (; fed < k; ++fed) {
    const int32_t d = seq.drafts[fed];
    if (d < 0 || d >= vocab || !token_allowed(seq.allowed.data() + fed * words, d) || !c.accept(d)) break;
    if (c.terminated()) {
      c.rollback(1);
      break;
    }
    c.fill_allowed(std::span<uint32_t>(seq.allowed.data() + (fed + 1) * words, words));
  }
  if (fed > 0) c.rollback(static_cast<int>(fed));
  seq.allowed.resize((fed + 1) * words);
  return fed;
}

bool BatchEngine::follow_constraint(Sequence* seq, int32_t token) {
  if (!seq->constraint || seq->constraint->accept(token)) return true;
  end(seq, FinishReason::kError,
      "constrained decoding: the selected token " + std::to_string(token) + " is not one the grammar allows");
  return false;
}

Status BatchEngine::propose(const ScheduledStep& plan, const std::vector<int64_t>& computed_from,
                            const std::vector<int64_t>& computed_rows) {
  int64_t decoding = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i)
    if (computed_rows[i] > 0 && plan.chunks[i].seq->pending() == 1) ++decoding;
  // Too many decoding sequences for drafting to pay: the drafter only follows this step's rows, and the next step
  // decodes plainly (which drafting reproduces anyway).
  const bool drafting = config_.speculative_max_batch <= 0 || decoding <= config_.speculative_max_batch;
  // The next step's pass verifies inside the runner's batch-invariance bound: one depth for every sequence that
  // drafts, sized beside the prompt chunks the scheduler is expected to run with them (verification_depth trims
  // the drafts again should other chunks come).
  int64_t depth = 0, would_draft = 0;
  if (drafting) {
    int64_t wanting = 0;
    for (size_t i = 0; i < plan.chunks.size(); ++i)
      if (computed_rows[i] > 0 && plan.chunks[i].seq->pending() == 1) {
        const int64_t budget = draft_budget(*plan.chunks[i].seq);
        wanting += budget > 0;
        would_draft = std::max(would_draft, budget);
      }
    depth = fair_draft_depth(config_.speculative_depth, decoding, wanting,
                             scheduler_.forecast_prompt_chunks(decoding), bound_);
  }
  bound_counted_ = depth < would_draft;
  if (bound_counted_) ++spec_.bound_limited_steps;
  DraftStep ds;
  ds.taps = output_.taps;
  next_tokens_.assign(plan.chunks.size(), {});
  std::vector<Sequence*> proposed;
  int64_t row = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const int64_t step_rows = static_cast<int64_t>(steps_[i].tokens.size());
    const int64_t tap_row = row;
    row += step_rows;
    if (computed_rows[i] <= 0) continue;  // ended this step
    Sequence* seq = plan.chunks[i].seq;
    std::vector<int32_t>& next = next_tokens_[i];
    const int64_t from = computed_from[i], rows = computed_rows[i];
    // Row p's following token: the prompt's next token, or what this step accepted and sampled.
    next.assign(seq->tokens.begin() + from + 1, seq->tokens.begin() + from + rows + 1);
    DraftSequence d;
    d.seq_id = static_cast<int64_t>(seq->id);
    d.start_position = from;
    d.num_rows = rows;
    d.tap_row = tap_row;
    d.next_tokens = next.data();
    d.depth = seq->pending() == 1 ? static_cast<int>(std::min(draft_budget(*seq), depth)) : 0;
    d.temperature = seq->sampler.greedy() ? 0.0f : seq->sampler.options().temperature;
    d.seed = seq->sampler.options().seed;
    d.block_table = seq->kv.blocks.data();
    d.num_blocks = static_cast<int64_t>(seq->kv.blocks.size());
    ds.seqs.push_back(d);
    proposed.push_back(seq);
    seq->drafter_knows = true;
  }
  if (ds.seqs.empty()) return ok_status();
  KILN_RETURN_IF_ERROR(drafter_->propose(ds, proposals_));
  if (proposals_.size() != ds.seqs.size())
    return internal_error("the drafter answered " + std::to_string(proposals_.size()) + " of " +
                          std::to_string(ds.seqs.size()) + " sequences");
  for (size_t b = 0; b < proposed.size(); ++b) {
    Sequence* seq = proposed[b];
    const DraftProposal& p = proposals_[b];
    const size_t k = std::min<size_t>(p.tokens.size(), static_cast<size_t>(ds.seqs[b].depth));
    seq->drafts.assign(p.tokens.begin(), p.tokens.begin() + k);
    seq->q_ids = p.q_ids, seq->q_probs = p.q_probs, seq->q_width = p.q_width;
  }
  return ok_status();
}

void BatchEngine::step() {
  const ScheduledStep plan = scheduler_.schedule();
  if (plan.chunks.empty()) return;  // only after a step that preempted everything; the next one admits
  const size_t n = plan.chunks.size();
  build_step(plan);
  Status status = ok_status();
  // A verification pass feeds drafts that may be rejected through recurrent layers: keep each such sequence's state
  // as it was before, to restore after a rejection.
  if (caches_->has_state())
    for (size_t i = 0; status.ok() && i < n; ++i)
      if (!verify_tokens_[i].empty()) status = caches_->snapshot_state(plan.chunks[i].seq->state_slot);
  if (status.ok()) status = runner_->step(steps_, select_, options_, output_);
  if (status.ok() && (output_.tokens.size() != n || output_.accepted.size() != n))
    status = internal_error("the model runner answered " + std::to_string(output_.tokens.size()) + " of " +
                            std::to_string(n) + " steps");
  for (size_t i = 0; status.ok() && i < n; ++i) {
    const int64_t want = select_[i].select ? 1 : 0;
    const int64_t got = static_cast<int64_t>(output_.tokens[i].size()), a = output_.accepted[i];
    if (got < want || a < 0 || a > select_[i].num_drafts || (want && got != a + 1))
      status = internal_error("the model runner selected " + std::to_string(got) + " tokens (" + std::to_string(a) +
                              " accepted) for step " + std::to_string(i));
  }
  if (status.ok() && drafter_ && output_.taps.size() != options_.tap_layers.size())
    status = internal_error("the model runner returned " + std::to_string(output_.taps.size()) + " of the " +
                            std::to_string(options_.tap_layers.size()) + " layers the drafter taps");
  if (!status.ok()) {
    log::error("engine: step over {} sequences failed: {}", n, status.to_string());
    for (const ScheduledChunk& c : plan.chunks) fail(c.seq, "", status);
    return;
  }

  std::vector<int64_t> computed_from(n), computed_rows(n, 0);
  replay_steps_.clear();
  replay_seqs_.clear();
  for (size_t i = 0; i < n; ++i) {
    Sequence* seq = plan.chunks[i].seq;
    computed_from[i] = seq->num_computed;
    const std::vector<int32_t>& tokens = output_.tokens[i];
    if (verify_tokens_[i].empty()) {
      scheduler_.on_computed(plan.chunks[i]);
      computed_rows[i] = plan.chunks[i].num_tokens;
      if (select_[i].select && (!follow_constraint(seq, tokens[0]) || !emit_token(seq, tokens[0], logprobs_of(i, 0))))
        computed_rows[i] = 0;
      if (!select_[i].select && seq->report_prefill_progress && seq->generated() == 0 && !emit_prefill_progress(seq)) computed_rows[i] = 0;
      continue;
    }
    // Verification of t_L and K drafts: the accepted prefix, then the correction or bonus token.
    const int64_t k = select_[i].num_drafts, a = output_.accepted[i];
    spec_.record(k, a);

    seq->tokens.insert(seq->tokens.end(), tokens.begin(), tokens.begin() + a);
    scheduler_.on_computed(ScheduledChunk{seq, a + 1});
    computed_rows[i] = a + 1;
    if (Status r = drafter_->rollback(static_cast<int64_t>(seq->id), seq->num_computed); !r.ok()) {
      fail(seq, "drafter rollback: ", r);
      computed_rows[i] = 0;
      continue;
    }
    bool alive = true;
    const int64_t before = seq->generated() - a;
    for (int64_t t = 0; t < a && alive; ++t)
      alive = follow_constraint(seq, tokens[t]) && emit_accepted(seq, tokens[t], before + t + 1, logprobs_of(i, t));
    if (alive) alive = follow_constraint(seq, tokens[a]) && emit_token(seq, tokens[a], logprobs_of(i, a));
    if (!alive) {
      computed_rows[i] = 0;  // ended: its state slot went with it
      continue;
    }
    if (a < k && caches_->has_state()) {
      // The state went on past the rejected drafts: back to before t_L, then t_L and the accepted drafts again
      // (their pages are rewritten with the same rows). verify_tokens_[i] lives until the replay ran.
      if (Status r = caches_->restore_state(seq->state_slot); !r.ok()) {
        fail(seq, "state rollback: ", r);
        computed_rows[i] = 0;
        continue;
      }
      replay_steps_.push_back(SequenceStep{std::span<const int32_t>(verify_tokens_[i].data(), a + 1),
                                           computed_from[i], &seq->kv.blocks, false, seq->state_slot, {}});
      replay_steps_.back().prompt_length = seq->prompt_len;
      replay_seqs_.push_back(seq);
    }
  }
  if (!drafter_) return;
  if (Status s = propose(plan, computed_from, computed_rows); !s.ok()) {
    log::error("engine: drafting failed: {}", s.to_string());
    for (size_t i = 0; i < n; ++i)
      if (computed_rows[i] > 0) fail(plan.chunks[i].seq, "drafter: ", s);
    return;  // every sequence to replay has ended
  }
  // After the drafter read this step's taps (a step's tap memory is the model's until its next step).
  replay_accepted();
}

void BatchEngine::replay_accepted() {
  if (replay_steps_.empty()) return;
  // Only sequences still running are listed (those that ended while emitting were left out).
  const Status status = runner_->step(replay_steps_, {}, StepOptions{}, replay_output_);
  if (status.ok()) return;
  log::error("engine: replaying accepted tokens after a rejection failed: {}", status.to_string());
  for (Sequence* seq : replay_seqs_) fail(seq, "state replay: ", status);
}

const TokenLogprobs* BatchEngine::logprobs_of(size_t entry, int64_t t) const {
  if (entry >= output_.logprobs.size() || t >= static_cast<int64_t>(output_.logprobs[entry].size())) return nullptr;
  return &output_.logprobs[entry][t];
}

bool BatchEngine::reports_logprobs() const { return runner_->reports_logprobs(); }
bool BatchEngine::applies_constraints() const { return runner_->applies_token_masks(); }
bool BatchEngine::applies_logit_adjustments() const { return runner_->applies_logit_adjustments(); }
int64_t BatchEngine::vocab_size() const { return runner_->vocab_size(); }

bool BatchEngine::emit_token(Sequence* seq, int32_t token, const TokenLogprobs* logprobs) {
  seq->tokens.push_back(token);
  return emit_accepted(seq, token, seq->generated(), logprobs);
}

bool BatchEngine::emit_accepted(Sequence* seq, int32_t token, int64_t completion_tokens, const TokenLogprobs* logprobs) {
  if (completion_tokens == 1) prompt_tokens_total_ += seq->prompt_len;
  ++generation_tokens_total_;
  TokenEvent event;
  event.token = token;
  if (logprobs && seq->logprobs >= 0) {
    event.has_logprobs = true;
    event.logprob = logprobs->logprob;
    event.top_logprobs = logprobs->top;
  }
  event.completion_tokens = completion_tokens;
  if (std::find(seq->stop_token_ids.begin(), seq->stop_token_ids.end(), token) != seq->stop_token_ids.end() ||
      (seq->constraint && seq->constraint->terminated()))
    event.finish_reason = FinishReason::kStop;
  else if (completion_tokens >= seq->max_tokens)
    event.finish_reason = FinishReason::kLength;
  event.finished = event.finish_reason != FinishReason::kNone;
  return emit(seq, event);
}

bool BatchEngine::emit_prefill_progress(Sequence* seq) {
  TokenEvent event;
  event.prefilled_tokens = std::min(seq->num_computed, seq->prompt_len);
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

void BatchEngine::fail(Sequence* seq, const std::string& context, const Status& why) {
  TokenEvent event;
  event.finished = true;
  event.finish_reason = FinishReason::kError;
  event.error = context + why.to_string();
  event.error_code = why.code();
  emit(seq, event);
}

void BatchEngine::publish_metrics() {
  const PrefixCacheStats prefix = caches_->blocks().prefix_stats();
  std::lock_guard<std::mutex> lock(mutex_);
  metrics_.requests_running = scheduler_.num_running();
  metrics_.requests_waiting = scheduler_.num_waiting();
  const BlockManager& blocks = caches_->blocks();
  metrics_.kv_blocks_total = blocks.num_blocks();
  metrics_.kv_blocks_used = blocks.used_blocks();
  metrics_.kv_block_size = blocks.block_size();
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
  metrics_.spec_bound_limited_steps = spec_.bound_limited_steps;
  waiting_ = scheduler_.num_waiting();
  idle_now_ = scheduler_.empty();
  if (idle_now_) idle_.notify_all();
}

}  // namespace kiln
