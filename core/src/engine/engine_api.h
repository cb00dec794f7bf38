// The boundary between the HTTP server and the inference engine: requests in (token ids + sampling),
// token events out. The server owns text (tokenizer, chat template, stop strings, parsers); the engine owns
// sequences, KV blocks and batching. Events are delivered on the engine's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampler.h"
#include "engine/token_constraint.h"
#include "kiln/status.h"

namespace kiln {

// A media item in a request's prompt, encoded by the recipe's modality: prompt[position + first_placeholder ..
// + num_embeddings) take the embedding rows instead of their tokens' embeddings.
struct RequestMedia {
  int64_t position = 0;           // where the item's tokens start in the prompt
  int64_t length = 0;             // how many prompt tokens stand for it (markers and placeholders)
  int64_t first_placeholder = 0;  // offset of its first placeholder within those tokens
  int64_t num_embeddings = 0;
  std::vector<float> embeddings;  // [num_embeddings, hidden] fp32
  uint64_t hash = 0;              // content hash: joins the prefix-cache key of the blocks holding its tokens
};

struct RequestParams {
  std::vector<int32_t> prompt;
  std::vector<RequestMedia> media;  // in prompt order, not overlapping
  int64_t max_tokens = 256;
  SamplingOptions sampling;
  std::vector<int32_t> stop_token_ids;  // generation ends after one of these (it is reported, with finished = true)
  // Report each prefill chunk that does not finish the prompt (a token-less event with prefilled_tokens), so a
  // client waiting out a long prompt can be told how far it got.
  bool report_prefill_progress = false;
  // ≥ 0: each token event carries the token's logprob and this many top alternatives (Engine::reports_logprobs).
  int32_t logprobs = -1;
  // Constrained decoding: every selected token is one the constraint allows (Engine::applies_constraints), and it
  // follows each accepted token. Its stop tokens should be among stop_token_ids, so completing it ends the request.
  std::shared_ptr<TokenConstraint> constraint;
};

// The most top alternatives a token event carries (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

struct TokenEvent {
  uint64_t request_id = 0;
  int32_t token = -1;             // -1 when the event carries no token (abort, error)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;              // set with kError
  // With kError, the failure's kind: kUnavailable when a device or peer is gone (a broken tensor-parallel group),
  // which the server answers 503; kInternal for a fault of kiln (500).
  StatusCode error_code = StatusCode::kInternal;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // including this token
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t prefilled_tokens = 0;      // progress events only: prompt tokens whose KV is computed so far
  // With RequestParams::logprobs ≥ 0, on token events: the token's log-probability under the model (log-softmax of
  // the target's logits row that selected it, before temperature / top-k / top-p) and the row's top alternatives.
  bool has_logprobs = false;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// Returns false when the consumer is gone (client disconnected): the engine then frees the sequence at once.
using TokenSink = std::function<bool(const TokenEvent&)>;

struct EngineMetrics {
  int64_t requests_running = 0, requests_waiting = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_block_size = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in tokens
  int64_t preemptions_total = 0;
  int64_t max_model_len = 0;
  // Speculative decoding: verification passes that carried drafts, draft tokens proposed and accepted, and
  // per draft position (0 = the first draft) how often it was proposed and accepted.
  int64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  std::vector<int64_t> spec_drafted_per_pos, spec_accepted_per_pos;
  // Steps where the model runner's batch-invariance bound made drafting shallower than K, or turned it off.
  int64_t spec_bound_limited_steps = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Queues a request. Refuses at once (never hangs) with kInvalidArgument when it can never fit
  // (prompt + max_tokens > max_model_len, or more KV than the whole pool) and kResourceExhausted when the
  // waiting queue is full.
  virtual Result<uint64_t> submit(RequestParams params, TokenSink sink) = 0;
  virtual void cancel(uint64_t request_id) = 0;
  virtual EngineMetrics metrics() const = 0;
  // Whether token events can carry logprobs (the model runner computes them: CPU and CUDA runners do).
  virtual bool reports_logprobs() const { return false; }
  // Whether requests may carry a TokenConstraint (the host and the CUDA token selection apply masks), and the
  // vocabulary size its masks cover.
  virtual bool applies_constraints() const { return false; }
  // Whether requests may carry penalties, logit_bias and min_p (SamplingOptions; the host and the CUDA token
  // selection apply them).
  virtual bool applies_logit_adjustments() const { return false; }
  virtual int64_t vocab_size() const { return 0; }
  // Stops admitting requests, finishes the running and waiting ones, then returns.
  virtual void drain() = 0;
};

}  // namespace kiln
