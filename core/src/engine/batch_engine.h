// The serving engine: one loop thread batches every running sequence into each step (continuous batching,
// scheduler.h); the model runner selects each sequence's token on the model's device from its own sampling
// settings and the uniforms its seeded generator draws here, and TokenEvents stream to each request's sink on that
// thread. submit/cancel/metrics/drain are thread-safe.
//
// Speculative decoding. After every step the drafter follows the rows the step computed (their taps stay on the
// device) and proposes up to K drafts for each sequence that decodes next; the next step runs each such
// sequence's newest token and its drafts in one verification pass (the same forward as every other sequence's
// decode or prompt chunk), and the runner accepts a prefix plus one token (greedy, or rejection sampling against
// the drafts' sparse q). KV rows past the accepted ones are overwritten before anything reads them. Each pass that
// verifies stays inside the runner's batch-invariance bound (draft_depth.h): the drafting sequences share the rows
// it leaves at one depth ≤ K, and a step where not even one draft each fits runs without drafts.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/cache_manager.h"
#include "engine/draft_depth.h"
#include "engine/engine_api.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/speculative_metrics.h"
#include "kiln/drafter.h"

namespace kiln {

// `config` as the engine runs it: under config.batch_invariant, its step and chunk limits lowered to the runner's
// batch-invariance bound (an error when max_num_seqs decodes could not fit in it); otherwise unchanged.
Result<EngineConfig> apply_batch_invariance(const EngineConfig& config, const BatchInvariance& bound);

class BatchEngine final : public Engine {
 public:
  // Validates the config and starts the loop thread. `caches` holds the pool the runner's KV lives in (its blocks
  // must be config.num_blocks of config.block_size); null makes one without memory (a runner that keeps its own KV).
  // With a drafter and config.speculative_depth = K > 0, decoding sequences are verified K drafts at a time.
  static Result<std::unique_ptr<BatchEngine>> create(const EngineConfig& config, std::unique_ptr<ModelRunner> runner,
                                                     std::shared_ptr<Drafter> drafter = nullptr,
                                                     std::shared_ptr<CacheManager> caches = nullptr);
  // Aborts whatever is still queued or running (kAbort events) and joins the loop.
  ~BatchEngine() override;

  Result<uint64_t> submit(RequestParams params, TokenSink sink) override;
  // The request ends with a kAbort event and its blocks are freed at the next step boundary.
  void cancel(uint64_t request_id) override;
  EngineMetrics metrics() const override;
  // Refuses new requests (kUnavailable), runs the queued and running ones to completion, stops the loop.
  void drain() override;
  bool reports_logprobs() const override;
  bool applies_logit_adjustments() const override;
  bool applies_constraints() const override;
  int64_t vocab_size() const override;

  const EngineConfig& config() const { return config_; }

 private:
  BatchEngine(const EngineConfig& config, std::unique_ptr<ModelRunner> runner, std::shared_ptr<Drafter> drafter,
              std::shared_ptr<CacheManager> caches);
  void loop();
  void step();
  // The step's inputs from the scheduler's plan: each chunk's tokens (a verification pass where drafts wait) and
  // what to select after it.
  void build_step(const ScheduledStep& plan);
  // After the step: the drafter follows the rows each live sequence computed and proposes its next drafts.
  Status propose(const ScheduledStep& plan, const std::vector<int64_t>& computed_from,
                 const std::vector<int64_t>& computed_rows);
  // Drafts the engine lets a sequence have now (0: it does not decode next, or is near its limits).
  int64_t draft_budget(const Sequence& seq) const;
  int64_t drafts_ready(const ScheduledChunk& chunk) const;
  // The depth every verifying sequence of the step's pass gets (draft_depth.h), and the bound-limited count.
  int64_t verification_depth(const ScheduledStep& plan);
  Status check_media(const RequestParams& params) const;
  // A constrained sequence about to select: fills seq.allowed with the masks of its pass's rows and returns how many
  // of its k drafts the pass verifies (the drafts the constraint allows, up to the first it refuses).
  int64_t constrain(Sequence& seq, int64_t k);
  // Advances the sequence's constraint over a selected token; a refusal (a selection that ignored the mask) ends it
  // with an error. Returns whether it is still running.
  bool follow_constraint(Sequence* seq, int32_t token);
  // Delivers an event; a final event or a consumer that is gone ends the sequence at once (the pointer is
  // then invalid). Returns whether the sequence is still running.
  bool emit(Sequence* seq, const TokenEvent& event);
  // A prefill chunk that left part of the prompt to compute, for a request that asked to hear of it.
  bool emit_prefill_progress(Sequence* seq);
  // Appends a sampled token and emits it with its stop / length check; false once the sequence has ended.
  bool emit_token(Sequence* seq, int32_t token, const TokenLogprobs* logprobs = nullptr);
  // Emits a token already in seq->tokens as the request's `completion_tokens`-th.
  bool emit_accepted(Sequence* seq, int32_t token, int64_t completion_tokens,
                     const TokenLogprobs* logprobs = nullptr);
  // This step's logprobs of entry `entry`'s t-th selected token; null when not asked or not reported.
  const TokenLogprobs* logprobs_of(size_t entry, int64_t t) const;
  void end(Sequence* seq, FinishReason reason, const std::string& error = "");
  // Ends `seq` with an error: `context` + `why`, keeping why's kind for the server (TokenEvent::error_code).
  void fail(Sequence* seq, const std::string& context, const Status& why);
  void publish_metrics();

  const EngineConfig config_;
  std::unique_ptr<ModelRunner> runner_;
  std::shared_ptr<CacheManager> caches_;
  Scheduler scheduler_;  // touched by the loop thread only
  std::shared_ptr<Drafter> drafter_;  // null: no speculative decoding
  // The runner's batch-invariance bound: every pass that verifies drafts stays inside it.
  BatchInvariance bound_;
  bool bound_counted_ = false;  // the last proposal already counted the coming step as bound-limited
  StepOptions options_;               // the drafter's tap layers
  StepOutput output_;
  std::vector<SequenceStep> steps_;
  std::vector<TokenSelection> select_;
  std::vector<std::vector<int32_t>> verify_tokens_;  // per chunk: [t_L, drafts...] or empty
  // Recurrent state after a verification that rejected drafts: the sequences' state slots are restored from the
  // snapshot taken before it, and their accepted tokens fed again (one step over all of them, no selection).
  std::vector<SequenceStep> replay_steps_;
  std::vector<Sequence*> replay_seqs_;
  StepOutput replay_output_;
  void replay_accepted();
  std::vector<std::vector<MediaRows>> media_rows_;  // per chunk: its media overrides
  std::vector<std::vector<int32_t>> next_tokens_;   // per proposed sequence: the tokens after its rows
  std::vector<DraftProposal> proposals_;
  SpeculativeMetrics spec_;

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
