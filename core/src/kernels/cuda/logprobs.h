// Logprobs on the device (model/host_token_select.h: token_logprobs): per logits row its log-partition and the
// values of its most likely tokens, taken before the selection adjusts or masks the rows in place; after selection,
// each selected token's own logit from the model. Only these few numbers go to the host, which forms the logprobs
// (value − log_z) with the host's own arithmetic.
#pragma once

#include <cstdint>

#include "kernels/cpu/token_select.h"
#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"
#include "model/logit_adjustment.h"

namespace kiln::cuda {

// For each i < num_rows, over logits row rows[i]: log_z[i] = max + log Σ exp(x − max) (max the row's largest logit,
// the sum in fp64, as token_logprobs forms them), and with top_n > 0, top_values[i · top_n + j] = the row's logit at
// top_ids[i · top_n + j] (NaN where that id is −1). One block per row.
Status logprob_row_stats(const float* logits, int64_t vocab, const int32_t* rows, int64_t num_rows,
                         const int32_t* top_ids, int64_t top_n, double* log_z, float* top_values, StreamHandle stream);

// What selected_logits reads: select_tokens' inputs and outputs, and where each sequence's rows sit in the logprobs
// and adjustment tables the selection uploaded.
struct SelectedLogitsArgs {
  const float* logits;  // [rows, vocab], adjusted in place after logprob_row_stats
  int64_t vocab;
  const cpu::SelectSeq* seqs;
  int64_t num_seqs;
  int64_t max_drafts;      // tokens' row stride is max_drafts + 1
  const int32_t* tokens;   // select_tokens' outputs
  const int32_t* accepted;
  // Per sequence: its row 0 in the logprobs table (−1: no logprobs asked), and in the adjustment table (−1: none).
  // Row t of a sequence is table row first + t.
  const int32_t* logprob_row;
  const int32_t* adjusted_row;
  // The adjustment table: row r's adjustments [offsets[r], offsets[r + 1]), tokens ascending, and each one's logit
  // before adjust_logits changed it.
  const int32_t* adjustment_offsets;
  const LogitAdjustment* adjustments;
  const float* original;
  float* values;  // [logprobs table rows]: the logit of the token selected at that row, the model's own
};

// One thread per (sequence, row slot). A selected token is never one that masks or min_p cut (it could not have been
// selected) unless a row had no allowed token at all; an adjusted one's value comes from `original`.
Status selected_logits(const SelectedLogitsArgs& args, StreamHandle stream);

}  // namespace kiln::cuda
