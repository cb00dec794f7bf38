// Portable SIMD for the hot loops: GCC/Clang vector extensions (16 fp32 lanes, lowered to whatever the
// target has) plus run-time ISA dispatch. The library is built for the baseline ISA so it runs on any CI
// machine; a kernel is compiled again with KILN_TARGET_AVX2 / KILN_TARGET_AVX512 and `pick_isa` chooses by
// CPU features. (Not target_clones("arch=..."): GCC dispatches those on the CPU *model*, so an unnamed
// server model in a VM silently gets the baseline clone. Not `omp simd reduction`: GCC 12 leaves it scalar.)
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KILN_HAVE_ISA_DISPATCH 1
#define KILN_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define KILN_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#else
#define KILN_HAVE_ISA_DISPATCH 0
#define KILN_TARGET_AVX2
#define KILN_TARGET_AVX512
#endif
#define KILN_INLINE inline __attribute__((always_inline))

// Every helper is always inlined into a cloned function, so the by-value vector ABI never applies.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kiln::cpu::simd {

// The best of three compilations of one kernel for this CPU.
template <class Fn>
Fn pick_isa(Fn base, Fn avx2, Fn avx512) {
#if KILN_HAVE_ISA_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return avx2;
#endif
  return base;
}

constexpr int64_t kLanes = 16;
using F32x16 = float __attribute__((vector_size(64)));
using U32x16 = uint32_t __attribute__((vector_size(64)));
using U16x16 = uint16_t __attribute__((vector_size(32)));

KILN_INLINE F32x16 load(const float* p) {
  F32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// bf16 -> fp32 is a 16-bit shift of the pattern.
KILN_INLINE F32x16 load_bf16(const uint16_t* p) {
  U16x16 h;
  std::memcpy(&h, p, sizeof(h));
  return (F32x16)(__builtin_convertvector(h, U32x16) << 16);  // same-size vector cast = bit reinterpretation
}

KILN_INLINE void store(float* p, F32x16 v) { std::memcpy(p, &v, sizeof(v)); }

KILN_INLINE float reduce_add(F32x16 v) {
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

KILN_INLINE F32x16 splat(float x) { return F32x16{} + x; }

KILN_INLINE float dot(const float* a, const float* b, int64_t n) {
  F32x16 acc0{}, acc1{};
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc0 += load(a + i) * load(b + i);
    acc1 += load(a + i + kLanes) * load(b + i + kLanes);
  }
  for (; i + kLanes <= n; i += kLanes) acc0 += load(a + i) * load(b + i);
  float s = reduce_add(acc0 + acc1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += alpha · x
KILN_INLINE void axpy(float alpha, const float* x, float* y, int64_t n) {
  const F32x16 a = splat(alpha);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, load(y + i) + a * load(x + i));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace kiln::cpu::simd

#pragma GCC diagnostic pop
