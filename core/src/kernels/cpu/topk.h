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

}  // namespace kiln::cpu
