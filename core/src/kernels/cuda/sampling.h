// Token selection on the GPU for a batch of logit rows (semantics of kernels/cpu/sampling.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// out[r] = argmax of row r (lowest index among equal maxima, NaN never wins). logits fp32 [rows, vocab].
Status argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, StreamHandle stream);

// Per-row sampling settings, in device memory. u is the row's uniform draw in [0, 1), made on the host exactly as
// cpu::sample_from_distribution makes it ((rng() >> 11) · 2^-53), so a seed gives the same tokens on both.
struct SampleRow {
  float temperature = 1.0f;  // ≤ 0: greedy
  int32_t top_k = 0;         // ≤ 0 or ≥ vocab: off
  float top_p = 1.0f;        // ≥ 1: off
  double u = 0.0;
};

// Workspace for sample_rows: the top-k candidate lists.
size_t sample_workspace_bytes(int64_t rows, int64_t max_candidates);

// Greedy rows as argmax_rows; otherwise softmax(logits / T), restricted to the top_k largest and then to the top_p
// nucleus, renormalised, and drawn in index order. Rows that use top-k or top-p pick from the
// `max_candidates` (≤ 2048) most likely tokens: top_k is capped there, and a top-p nucleus wider than that is
// cut to it (kiln's CPU sampler has no cap). max_candidates = 0 is allowed when no row uses top-k / top-p.
Status sample_rows(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int64_t max_candidates,
                   void* workspace, int32_t* out, StreamHandle stream);

}  // namespace kiln::cuda
