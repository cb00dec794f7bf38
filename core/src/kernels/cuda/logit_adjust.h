// The host token selection's row adjustments on the device (model/host_token_select.h: apply_logit_adjustments,
// apply_min_p), bit for bit: sampling penalties and logit_bias on the tokens a row lists, and the min_p cut.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"
#include "model/logit_adjustment.h"

namespace kiln::cuda {

// For each i < num_rows, the adjustments [offsets[i], offsets[i + 1]) on logits row rows[i] (row · vocab): x →
// rep(x + bias) + add, each step rounded as the host rounds it (no fused multiply-add). A row's tokens must be
// distinct and in [0, vocab) (they are applied in parallel). original[k] receives adjustment k's logit before it, so
// the logprobs of a selected token can still be reported from the model's own value. One block per row.
Status adjust_logits(float* logits, int64_t vocab, const int32_t* rows, const int32_t* offsets,
                     const LogitAdjustment* adjustments, float* original, int64_t num_rows, StreamHandle stream);

// For each i < num_rows: logits of row rows[i] below max + log_offsets[i] become −inf, max the row's largest
// non-NaN logit (a row whose max is not finite is left alone). log_offsets[i] = (double) temperature ·
// log((double) min_p), formed on the host exactly as apply_min_p forms it, so the threshold is the host's to the bit.
// One block per row.
Status apply_min_p_rows(float* logits, int64_t vocab, const int32_t* rows, const double* log_offsets,
                        int64_t num_rows, StreamHandle stream);

}  // namespace kiln::cuda
