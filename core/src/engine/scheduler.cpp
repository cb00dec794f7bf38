#include "engine/scheduler.h"

#include <algorithm>
#include <string>

namespace kiln {

Status Scheduler::check_fits(const RequestParams& p) const {
  const int64_t prompt = static_cast<int64_t>(p.prompt.size());
  if (prompt == 0) return invalid_argument("the prompt has no tokens");
  if (p.max_tokens < 1) return invalid_argument("max_tokens must be at least 1, got " + std::to_string(p.max_tokens));
  const int64_t total = prompt + p.max_tokens;
  if (total > config_.max_model_len)
    return invalid_argument("the prompt (" + std::to_string(prompt) + " tokens) + max_tokens (" +
                            std::to_string(p.max_tokens) + ") = " + std::to_string(total) +
                            " tokens exceeds max_model_len (" + std::to_string(config_.max_model_len) + ")");
  // The last sampled token is never fed back, so its position needs no KV.
  const int64_t blocks = blocks_.blocks_for(total - 1);
  if (blocks > blocks_.num_blocks())
    return invalid_argument("the prompt (" + std::to_string(prompt) + " tokens) + max_tokens (" +
                            std::to_string(p.max_tokens) + ") needs " + std::to_string(blocks) + " KV blocks of " +
                            std::to_string(blocks_.block_size()) + " tokens; the whole KV pool has " +
                            std::to_string(blocks_.num_blocks()) + " (" +
                            std::to_string(blocks_.num_blocks() * blocks_.block_size()) + " tokens)");
  return ok_status();
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  waiting_.push_back(seq.get());
  sequences_.emplace(seq->id, std::move(seq));
}

Sequence* Scheduler::find(uint64_t id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : it->second.get();
}

std::vector<Sequence*> Scheduler::all() const {
  std::vector<Sequence*> out;
  for (const auto& [id, seq] : sequences_) out.push_back(seq.get());
  return out;
}

void Scheduler::release(Sequence* seq) {
  blocks_.release(seq->kv);
  caches_.release_state_slot(seq->state_slot);
  seq->state_slot = -1;
}

void Scheduler::preempt(Sequence* seq) {
  release(seq);
  seq->num_computed = 0;
  seq->drafts.clear();
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  ++preemptions_;
}

// Makes room for `tokens` more tokens of a running sequence, preempting newer running sequences that this
// step has not scheduled. False when none is left to preempt and the blocks are still missing.
bool Scheduler::reserve_running(Sequence* seq, int64_t tokens, int64_t& preempted) {
  const int64_t target = seq->num_computed + tokens;
  while (!blocks_.can_grow(seq->kv, target)) {
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend() && *it != seq; ++it)
      if ((*it)->scheduled_step != step_) {
        victim = *it;
        break;
      }
    if (!victim) return false;
    preempt(victim);
    ++preempted;
  }
  return blocks_.grow(seq->kv, target).ok();
}

int64_t Scheduler::chunk_of(const Sequence& seq, int64_t budget) const {
  const int64_t n = std::min(seq.pending(), budget);
  return config_.max_chunk_tokens > 0 ? std::min(n, config_.max_chunk_tokens) : n;
}

bool Scheduler::admit(Sequence* seq, int64_t& budget, ScheduledStep& step) {
  // A model with recurrent state recomputes from the start: its state is not in the prefix cache's blocks.
  const int64_t matched = caches_.has_state() ? 0 : blocks_.match_prefix(seq->tokens, seq->kv, seq->media_spans);
  seq->num_computed = matched;
  const int64_t n = chunk_of(*seq, budget);
  if (!blocks_.can_grow(seq->kv, seq->num_computed + n) || !blocks_.grow(seq->kv, seq->num_computed + n).ok()) {
    blocks_.release(seq->kv);
    seq->num_computed = 0;
    return false;
  }
  auto slot = caches_.acquire_state_slot(&seq->kv.blocks);
  if (!slot.ok()) {  // max_num_seqs bounds the running sequences, so this is a bookkeeping bug: refuse to admit
    blocks_.release(seq->kv);
    seq->num_computed = 0;
    return false;
  }
  seq->state_slot = *slot;
  blocks_.record_query(static_cast<int64_t>(seq->tokens.size()), matched);
  if (!seq->admitted_once) {
    seq->cached_prompt_tokens = matched;
    seq->admitted_once = true;
  }
  running_.push_back(seq);
  seq->scheduled_step = step_;
  step.chunks.push_back({seq, n});
  step.num_tokens += n;
  budget -= n;
  return true;
}

int64_t Scheduler::step_budget() const {
  const int64_t budget = config_.max_num_batched_tokens;
  if (config_.lone_prompt_tokens <= budget) return budget;
  // Alone: nothing else in the engine, or max_num_seqs = 1 (one runs at a time: whoever waits cannot start before it
  // finishes, so smaller steps would only delay everyone).
  const size_t held = running_.size() + waiting_.size();
  const bool alone = held == 1 || (held > 1 && config_.max_num_seqs <= 1);
  if (!alone) return budget;
  const Sequence* seq = running_.empty() ? waiting_.front() : running_.front();
  return !running_.empty() && seq->pending() <= 1 ? budget : config_.lone_prompt_tokens;
}

ScheduledStep Scheduler::schedule() {
  ++step_;
  ScheduledStep step;
  int64_t budget = step_budget();

  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    if (seq->pending() != 1) continue;
    if (!reserve_running(seq, 1, step.num_preempted)) {
      // Every newer sequence is gone and it still does not fit: it goes back to waiting too.
      preempt(seq);
      ++step.num_preempted;
      break;
    }
    seq->scheduled_step = step_;
    step.chunks.push_back({seq, 1});
    step.num_tokens += 1;
    budget -= 1;
  }

  const int64_t bs = blocks_.block_size();
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    if (seq->scheduled_step == step_) continue;
    int64_t n = chunk_of(*seq, budget);
    if (!reserve_running(seq, n, step.num_preempted)) {
      // Older sequences hold the rest of the pool: take what is free and wait for the rest.
      const int64_t fit = (static_cast<int64_t>(seq->kv.blocks.size()) + blocks_.free_blocks()) * bs -
                          blocks_.lookahead_slots() - seq->num_computed;
      n = std::min(n, fit);
      if (n < 1 || !blocks_.grow(seq->kv, seq->num_computed + n).ok()) continue;
    }
    seq->scheduled_step = step_;
    step.chunks.push_back({seq, n});
    step.num_tokens += n;
    budget -= n;
  }

  // A step that had to preempt is short of KV: admitting now would only preempt again.
  if (step.num_preempted == 0)
    while (!waiting_.empty() && num_running() < config_.max_num_seqs && budget > 0) {
      if (!admit(waiting_.front(), budget, step)) break;
      waiting_.pop_front();
    }
  return step;
}

PassRows Scheduler::forecast_prompt_chunks(int64_t decoding) const {
  PassRows chunks;
  int64_t budget = step_budget() - decoding;
  auto take = [&](const Sequence* seq) {
    const int64_t n = chunk_of(*seq, budget);
    chunks.rows += n;
    chunks.logit_rows += 1;
    budget -= n;
  };
  for (const Sequence* seq : running_)
    if (budget > 0 && seq->pending() > 1) take(seq);
  int64_t admitted = num_running();
  for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 && admitted < config_.max_num_seqs;
       ++it, ++admitted)
    take(*it);
  return chunks;
}

void Scheduler::on_computed(const ScheduledChunk& chunk) {
  Sequence* seq = chunk.seq;
  seq->num_computed += chunk.num_tokens;
  blocks_.commit(seq->kv, seq->tokens, seq->num_computed, seq->media_spans);
}

void Scheduler::finish(Sequence* seq) {
  release(seq);
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) waiting_.erase(it);
  sequences_.erase(seq->id);
}

}  // namespace kiln
