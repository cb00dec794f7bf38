// One request inside the engine: its tokens (prompt, then what it generated), how many of them have KV in
// the cache, its blocks, its sampler and where its events go.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/block_manager.h"
#include "engine/engine_api.h"
#include "engine/sampler.h"
#include "engine/sampling_penalties.h"

namespace kiln {

struct Sequence {
  Sequence(uint64_t id_, RequestParams params, TokenSink sink_)
      : id(id_),
        tokens(std::move(params.prompt)),
        prompt_len(static_cast<int64_t>(tokens.size())),
        max_tokens(params.max_tokens),
        stop_token_ids(std::move(params.stop_token_ids)),
        report_prefill_progress(params.report_prefill_progress),
        logprobs(params.logprobs),
        sampler(params.sampling),
        sink(std::move(sink_)),
        media(std::move(params.media)),
        constraint(std::move(params.constraint)) {
    for (const RequestMedia& m : media) media_spans.push_back({m.position, m.length, m.hash});
    if (params.sampling.adjusts_logits()) penalties.emplace(params.sampling, tokens);
  }

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  // Tokens still to compute before the next sample (1 for a decoding sequence).
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - num_computed; }

  uint64_t id;
  std::vector<int32_t> tokens;
  int64_t prompt_len;
  int64_t num_computed = 0;  // tokens whose KV is in the cache; reset to 0 by preemption (recompute)
  int64_t max_tokens;
  std::vector<int32_t> stop_token_ids;
  bool report_prefill_progress;
  int32_t logprobs;  // -1: none
  Sampler sampler;
  TokenSink sink;
  BlockTable kv;
  int64_t cached_prompt_tokens = 0;  // from the prefix cache at first admission
  bool admitted_once = false;
  uint64_t scheduled_step = 0;  // the last step that scheduled it (0 = never)

  int32_t state_slot = -1;  // CacheManager state slot while running (models with recurrent layers)

  // Media items of the prompt (embedding overrides), and their spans for the prefix-cache key.
  std::vector<RequestMedia> media;
  std::vector<MediaSpan> media_spans;

  // Speculative decoding: the drafts proposed after the last step, verified by the next one (with their sparse q
  // on the model's device, valid until the drafter's next call), and whether the drafter holds state for it.
  std::vector<int32_t> drafts;
  const int32_t* q_ids = nullptr;
  const float* q_probs = nullptr;
  int64_t q_width = 0;
  bool drafter_knows = false;

  // Constrained decoding: the request's automaton, advanced over every emitted token; and the masks of the rows the
  // next selection reads (one row per verified position), filled when the step is built.
  std::shared_ptr<TokenConstraint> constraint;
  std::vector<uint32_t> allowed;

  // Sampling penalties and logit_bias: the history they follow, and the next selection's per-row adjustments.
  std::optional<SequencePenalties> penalties;
  std::vector<LogitAdjustment> adjustments;
  std::vector<int32_t> adjustment_offsets;
};

}  // namespace kiln
