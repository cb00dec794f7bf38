#include "kernels/cpu/vector_ops.h"

#include "kernels/cpu/simd.h"

// The vector helpers are always inlined into the ISA variants; their by-value ABI never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kiln::cpu {
namespace {

float dot_base(const float* a, const float* b, int64_t n) { return simd::dot(a, b, n); }
KILN_TARGET_AVX2 float dot_avx2(const float* a, const float* b, int64_t n) { return simd::dot(a, b, n); }
KILN_TARGET_AVX512 float dot_avx512(const float* a, const float* b, int64_t n) { return simd::dot(a, b, n); }
using DotFn = float (*)(const float*, const float*, int64_t);
const DotFn dot_impl = simd::pick_isa<DotFn>(dot_base, dot_avx2, dot_avx512);

void axpy_base(float alpha, const float* x, float* y, int64_t n) { simd::axpy(alpha, x, y, n); }
KILN_TARGET_AVX2 void axpy_avx2(float alpha, const float* x, float* y, int64_t n) { simd::axpy(alpha, x, y, n); }
KILN_TARGET_AVX512 void axpy_avx512(float alpha, const float* x, float* y, int64_t n) { simd::axpy(alpha, x, y, n); }
using AxpyFn = void (*)(float, const float*, float*, int64_t);
const AxpyFn axpy_impl = simd::pick_isa<AxpyFn>(axpy_base, axpy_avx2, axpy_avx512);

}  // namespace

float dot(const float* a, const float* b, int64_t n) { return dot_impl(a, b, n); }
void axpy(float alpha, const float* x, float* y, int64_t n) { axpy_impl(alpha, x, y, n); }

}  // namespace kiln::cpu
