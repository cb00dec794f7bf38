// How deep the engine drafts when a verification pass must stay inside the runner's batch-invariance bound
// (model/batch_invariance.h): beyond it a row's results depend on the other rows of its pass (on the GPU the GEMMs
// leave the batch-invariant kernels), so verified output would stop equalling undrafted output.
//
// A pass holds the decode rows of every decoding sequence — 1 + d rows for one verifying d drafts, each with
// logits — and the prompt chunks beside them (their tokens as rows, one logit row each). Every drafting sequence
// gets the same depth d (a fair share), the largest d ≤ K with which the whole pass fits both bounds, and 1 + d
// within the bound's chunk_rows (a longer pass would take the prefill path); 0 when not
// even d = 1 fits, and the step then decodes plainly, as speculative.max_batch makes it when many sequences decode.
#pragma once

#include <cstdint>

#include "model/batch_invariance.h"

namespace kiln {

// Rows of a pass's prompt chunks, counted as the bound counts them.
struct PassRows {
  int64_t rows = 0;
  int64_t logit_rows = 0;
};

// `decoding` sequences decode in the pass, `drafting` of them (≤ decoding) verify drafts; `chunks`: the prompt
// chunks beside them. The depth each drafting sequence may verify, in [0, depth].
int64_t fair_draft_depth(int64_t depth, int64_t decoding, int64_t drafting, PassRows chunks,
                         const BatchInvariance& bound);

}  // namespace kiln
