// Dot product and axpy over fp32 vectors, dispatched once to the widest ISA this CPU has (simd.h); shared by
// the attention and indexer kernels.
#pragma once

#include <cstdint>

namespace kiln::cpu {

float dot(const float* a, const float* b, int64_t n);
// y += alpha · x
void axpy(float alpha, const float* x, float* y, int64_t n);

}  // namespace kiln::cpu
