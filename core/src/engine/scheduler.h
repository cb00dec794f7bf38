// Continuous batching. Each step, in this order:
//   1. every running sequence that is decoding gets its one token (decodes are never starved);
//   2. running sequences part-way through their prompt get chunks from what is left of
//      max_num_batched_tokens;
//   3. waiting sequences (preempted ones first, then arrivals in order) are admitted while sequences,
//      tokens and KV blocks allow, starting from their cached prefix.
// When a running sequence cannot get a block, the newest running sequence not yet scheduled this step is
// preempted by recompute: its blocks are freed and it returns to the front of the waiting queue, to be
// prefilled again (its prompt and the tokens it generated) later. Waiting requests never preempt running ones.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/cache_manager.h"
#include "engine/draft_depth.h"
#include "engine/engine_config.h"
#include "engine/sequence.h"

namespace kiln {

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t num_tokens = 0;  // tokens[seq->num_computed, + num_tokens) are computed this step
};

struct ScheduledStep {
  std::vector<ScheduledChunk> chunks;  // decodes first
  int64_t num_tokens = 0;
  int64_t num_preempted = 0;
};

class Scheduler {
 public:
  // Blocks and state slots come from `caches`.
  Scheduler(const EngineConfig& config, CacheManager& caches) : config_(config), caches_(caches), blocks_(caches.blocks()) {}

  // Why a request can never run here (kInvalidArgument naming the numbers), or ok.
  Status check_fits(const RequestParams& params) const;
  void add(std::unique_ptr<Sequence> seq);

  ScheduledStep schedule();
  // The prompt chunks the next schedule() is expected to run beside `decoding` decodes, were KV no constraint:
  // running sequences part-way through their prompt, then waiting ones while max_num_seqs allows (all of their
  // tokens: a prefix-cache match is only known at admission). The engine sizes the next step's drafts against it.
  PassRows forecast_prompt_chunks(int64_t decoding) const;
  // After the step's forward pass: the chunk's tokens have KV now.
  void on_computed(const ScheduledChunk& chunk);
  // Frees the sequence's blocks and forgets it (finished, cancelled or its client gone).
  void finish(Sequence* seq);

  Sequence* find(uint64_t id) const;
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool empty() const { return sequences_.empty(); }
  int64_t preemptions() const { return preemptions_; }
  // Every sequence, for shutdown.
  std::vector<Sequence*> all() const;

 private:
  bool reserve_running(Sequence* seq, int64_t tokens, int64_t& preempted);
  bool admit(Sequence* seq, int64_t& budget, ScheduledStep& step);
  // The tokens of `seq` a step with `budget` tokens left runs: what is pending, within config.max_chunk_tokens.
  int64_t chunk_of(const Sequence& seq, int64_t budget) const;
  // Tokens the next step may compute: max_num_batched_tokens, or config.lone_prompt_tokens where one sequence is all
  // the engine holds and it is still in its prompt (running or about to be admitted) — or, with max_num_seqs = 1, the
  // one running or next admitted is in its prompt (those waiting cannot start before it ends).
  int64_t step_budget() const;
  void preempt(Sequence* seq);

  // Frees the sequence's blocks and state slot.
  void release(Sequence* seq);

  EngineConfig config_;
  CacheManager& caches_;
  BlockManager& blocks_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> sequences_;
  std::vector<Sequence*> running_;  // in admission order: the back is the newest
  std::deque<Sequence*> waiting_;
  uint64_t step_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace kiln
