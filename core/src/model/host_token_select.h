// The step's token selection from TokenSelection entries, the packing both devices share: the selected entries
// as cpu::SelectSeq rows with their drafts, uniforms and sparse q laid out as kernels/cpu/token_select.h takes them.
// On the CPU the reference runs over host logits (select_tokens_host); on CUDA the same arrays go to the device
// kernels (runtime/cuda/cuda_token_selection.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/token_select.h"
#include "kiln/draft_services.h"
#include "model/model_step.h"

namespace kiln {

// The selected entries packed for cpu::SelectArgs. q rows: where every entry's q is one device (or host) buffer of
// rows q_width apart — how a drafter hands them out — `q_base` is its lowest row and each entry's draft_offset its
// row there (drafts are laid out at the same offsets); else `q_base` is null and q must be packed (pack_q).
struct SelectionPlan {
  std::vector<size_t> entries;  // the selected entries' indices, in SelectSeq order
  std::vector<cpu::SelectSeq> seqs;
  std::vector<int32_t> drafts;
  std::vector<double> uniforms;
  int64_t max_drafts = 0;
  int64_t q_width = 0;
  const int32_t* q_ids = nullptr;  // the shared buffer's base, or null (no q, or it must be packed)
  const float* q_probs = nullptr;
  bool needs_q_pack = false;  // entries' q live in different buffers: copy them to rows at their draft_offset
};

// Plans the selection of `select` over logits rows at first_row (one per step entry).
Status plan_selection(std::span<const int64_t> first_row, std::span<const TokenSelection> select, SelectionPlan& plan);

// out.tokens / out.accepted from the kernels' [seqs, max_drafts + 1] tokens and [seqs] accepted.
void unpack_selection(const SelectionPlan& plan, size_t num_steps, const int32_t* tokens, const int32_t* accepted,
                      StepOutput& out);

// `token`'s log-softmax in one logits row and the row's `top_n` most likely tokens (ties: lower id first).
TokenLogprobs token_logprobs(const float* row, int64_t vocab, int32_t token, int32_t top_n);

// The whole selection over host logits [rows, vocab], with logprobs where a selection asks for them.
Status select_tokens_host(const float* logits, int64_t vocab, std::span<const int64_t> first_row,
                          std::span<const TokenSelection> select, StepOutput& out);

// TokenSelection::adjustments against its offsets (a partition into num_drafts + 1 rows), the vocabulary and a
// positive repetition.
Status check_logit_adjustments(const TokenSelection& s, int64_t vocab);

// Row adjustments of TokenSelection: logit_bias and penalties (in place, entries' tokens in range), and the min_p cut
// at a temperature (tokens below it to -inf; the likeliest token always stays).
void apply_logit_adjustments(float* row, std::span<const LogitAdjustment> adjustments);
void apply_min_p(float* row, int64_t vocab, float min_p, float temperature);

// DraftServices::sample on host memory.
Status sample_drafts_host(const DraftSampleRequest& request, int64_t vocab);

}  // namespace kiln
