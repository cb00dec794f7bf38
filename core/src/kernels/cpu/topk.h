// Deterministic top-k: the k largest values, ordered by value descending, ties broken by the lower index.
//
// torch.topk on the CPU does not promise an order among equal values: in torch 2.15,
// topk([1, 3, 3, 2, 3, 0, 3], 3) returns indices [1, 6, 4], and the order of tied zeros depends on the
// length. kiln fixes "lower index first" so CPU and GPU kernels agree exactly; results can differ from HF
// only when values tie exactly at the k-th place.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// Writes min(k, n) indices to `out`. NaN counts as smaller than every number.
void topk_indices(const float* values, int64_t n, int64_t k, int32_t* out);

// The indices torch.topk(values, k) returns on the CPU (largest, sorted), tied values included: torch selects with
// std::partial_sort (k·64 ≤ n) or std::nth_element over (value, index) pairs compared by value alone (NaN above
// every number), so the same procedure over the same row picks the same tied entries. transformers' DSA indexers
// cut their top-k through exact ties often (few indexer heads: every head's ReLU at 0 scores a key exactly 0), and
// which tied keys a query attends to then decides its output: the CPU reference follows torch to match it. The
// selection depends on the row's length (a query's row in a one-shot prefill is longer than in a decode step), as
// torch's does: the model passes transformers' row (SequenceStep::prompt_length), whatever its own step holds.
// min(k, n) indices; their order among equal values is torch's too.
void torch_cpu_topk_indices(const float* values, int64_t n, int64_t k, int32_t* out);

}  // namespace kiln::cpu
