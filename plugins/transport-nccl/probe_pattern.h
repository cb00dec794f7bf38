// The custom all-reduce's test data: each rank's input and the expected result, computed on the host the way the
// kernel must compute it (rank-order fp32 sum from rank 0's value, rounded once). Magnitudes span 2^±8 and signs
// and zeros vary so fp32 sums depend on their order (from three ranks) and bf16 sums round. Shared by the probe,
// the tests and the bench.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::nccl {

uint16_t bf16_bits(float value);  // round to nearest even, as __float2bfloat16_rn for finite values
float bf16_value(uint16_t bits);

// Element i of rank `rank`'s input (already rounded to bf16 for kBF16), as raw bytes of count elements.
std::vector<char> probe_input(DType dtype, int rank, int64_t count, uint32_t seed = 0);
std::vector<char> probe_expected_sum(DType dtype, int world_size, int64_t count, uint32_t seed = 0);

}  // namespace kiln::nccl
