// The prefill gate on the tensor cores (kernels/cuda/moe_gate_terms.h) against an fp64 reference of x · Wᵀ with the
// fp32 router: one, two and three bf16 terms (bf16 values, 16-bit values, any fp32), GLM-4.7-Flash / GLM-5 /
// DeepSeek-V3 and odd shapes. Only fp32 summation differs from the reference: each logit within a few fp32 steps
// of Σ|x·w| (the bound an fp32 GEMM of the widened input has too).
#include "kernels/cuda/moe_gate_terms.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "device_buffer.h"
#include "kernels/cpu/half_float.h"

namespace kiln::test {
namespace {

struct Blas {
  cublasHandle_t h = nullptr;
  Blas() { EXPECT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS); }
  ~Blas() { cublasDestroy(h); }
};

TEST(GpuMoeGateTerms, MatchesTheFp32ProductForOneTwoAndThreeTerms) {
  Blas blas;
  std::mt19937_64 rng(41);
  struct Shape {
    int64_t n, hidden, experts;
  };
  for (const Shape& s : {Shape{17, 2048, 64}, Shape{300, 6144, 256}, Shape{33, 7168, 256}, Shape{129, 516, 12},
                         Shape{1024, 2048, 64}}) {
    const Bf16Data x = random_bf16(size_t(s.n) * s.hidden, rng);
    for (int want_terms : {3, 2, 1}) {
      std::vector<float> w = random_f32(size_t(s.experts) * s.hidden, rng, -0.1f, 0.1f);
      for (float& v : w) {  // keep 8 / 16 / all 24 significand bits
        const uint32_t keep = want_terms == 1 ? 0xffff0000u : want_terms == 2 ? 0xffffff00u : 0xffffffffu;
        v = std::bit_cast<float>(std::bit_cast<uint32_t>(v) & keep);
      }
      std::vector<uint16_t> terms(3 * w.size());
      const int used = cpu::bf16_terms(w.data(), static_cast<int64_t>(w.size()), terms.data());
      ASSERT_EQ(used, want_terms);
      terms.resize(size_t(used) * w.size());
      std::vector<float> want(size_t(s.n) * s.experts), bound(want.size());
      for (int64_t t = 0; t < s.n; ++t)
        for (int64_t e = 0; e < s.experts; ++e) {
          double acc = 0, mag = 0;
          for (int64_t k = 0; k < s.hidden; ++k) {
            const double p = double(x.values[t * s.hidden + k]) * w[e * s.hidden + k];
            acc += p, mag += std::abs(p);
          }
          want[t * s.experts + e] = static_cast<float>(acc);
          bound[t * s.experts + e] = static_cast<float>(mag * 4 * std::ldexp(1.0, -24) * std::sqrt(double(s.hidden)));
        }
      DeviceBuffer<uint16_t> dx(x.bits), dterms(terms);
      DeviceBuffer<float> scratch(size_t(s.n) * used * s.experts), dy(want.size());
      dy.poison();
      KILN_STATUS_OK(cuda::moe_gate_logits_bf16_terms(blas.h, dx.get(), s.n, s.hidden, dterms.get(), used, s.experts,
                                                      scratch.get(), dy.get(), nullptr));
      const auto got = dy.download();
      int bad = 0;
      for (size_t i = 0; i < want.size() && bad < 5; ++i)
        if (!(std::abs(double(got[i]) - want[i]) <= bound[i]))
          ADD_FAILURE() << "n " << s.n << " hidden " << s.hidden << " experts " << s.experts << " terms " << used
                        << ": logit " << i << " " << got[i] << " vs " << want[i] << " (bound " << bound[i] << ")",
              ++bad;
    }
  }
}

// One-hot inputs pick single router weights: each logit is then the fp32 weight itself, bit for bit (one exact
// product a term, the two small terms' sum exact, and their sum with the large one the value) — a dropped or
// misplaced term shows here, below the summation bound above.
TEST(GpuMoeGateTerms, OneHotInputsGiveTheWeightsExactly) {
  Blas blas;
  std::mt19937_64 rng(43);
  const int64_t n = 96, hidden = 2048, experts = 64;
  std::vector<float> w = random_f32(size_t(experts) * hidden, rng, -0.1f, 0.1f);
  std::vector<uint16_t> terms(3 * w.size());
  const int used = cpu::bf16_terms(w.data(), static_cast<int64_t>(w.size()), terms.data());
  ASSERT_EQ(used, 3);
  std::vector<uint16_t> x(size_t(n) * hidden, 0);
  std::vector<int64_t> hot(n);
  for (int64_t t = 0; t < n; ++t) {
    hot[t] = static_cast<int64_t>(rng() % hidden);
    x[t * hidden + hot[t]] = 0x3f80;  // 1.0
  }
  DeviceBuffer<uint16_t> dx(x), dterms(terms);
  DeviceBuffer<float> scratch(size_t(n) * 3 * experts), dy(size_t(n) * experts);
  dy.poison();
  KILN_STATUS_OK(cuda::moe_gate_logits_bf16_terms(blas.h, dx.get(), n, hidden, dterms.get(), 3, experts,
                                                  scratch.get(), dy.get(), nullptr));
  const auto got = dy.download();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < experts; ++e)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[t * experts + e]), std::bit_cast<uint32_t>(w[e * hidden + hot[t]]))
          << "token " << t << " expert " << e;
}

TEST(GpuMoeGateTerms, RejectsWhatItCannotRun) {
  Blas blas;
  DeviceBuffer<uint16_t> x(64), w(192);
  DeviceBuffer<float> y(64);
  EXPECT_FALSE(cuda::moe_gate_logits_bf16_terms(blas.h, x.get(), 1, 8, w.get(), 4, 8, y.get(), y.get(), nullptr).ok());
  EXPECT_FALSE(cuda::moe_gate_logits_bf16_terms(blas.h, x.get(), 1, 8, w.get(), 3, 8, nullptr, y.get(), nullptr).ok());
  EXPECT_TRUE(cuda::moe_gate_logits_bf16_terms(blas.h, x.get(), 0, 8, w.get(), 1, 8, nullptr, y.get(), nullptr).ok());
}

}  // namespace
}  // namespace kiln::test
