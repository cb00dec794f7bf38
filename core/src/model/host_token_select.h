// Token selection over logits rows in host memory (the CPU model's device): plain sampling, greedy and sampled
// verification of drafts against sparse q, and draft sampling — the semantics the CUDA kernels implement on the
// device (kernels/cuda/token_select.h), on the cpu:: sampling rules (kernels/cpu/sampling.h).
#pragma once

#include <cstdint>
#include <span>

#include "kiln/draft_services.h"
#include "model/model_step.h"

namespace kiln {

// The first index, in index order, where the running sum of probs exceeds u · Σ probs (the last non-zero one when
// rounding leaves the sum a hair short).
int32_t draw_from_distribution(const float* probs, int64_t vocab, double u);

// For each entry with select set: out.tokens[i] and out.accepted[i] from the rows at first_row[i] (see
// TokenSelection). logits [rows, vocab].
Status select_tokens_host(const float* logits, int64_t vocab, std::span<const int64_t> first_row,
                          std::span<const TokenSelection> select, StepOutput& out);

// DraftServices::sample on host memory.
Status sample_drafts_host(const DraftSampleRequest& request, int64_t vocab);

}  // namespace kiln
