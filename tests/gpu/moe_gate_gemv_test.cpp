// The MoE gate GEMV (the router's logits for batch-invariant steps) against the CPU: fp32 products of the bf16
// input and the fp32 router, on several shapes incl. odd ones and hidden not a multiple of the block's stride;
// and every token's logits bitwise those of the token run alone.
#include "kernels/cuda/moe_gate_gemv.h"

#include <gtest/gtest.h>

#include <cstring>

#include "device_buffer.h"

namespace kiln::test {
namespace {

// Only the summation order differs from the fp64 reference.
constexpr double kTol = 1e-5;

TEST(GpuMoeGateGemv, MatchesCpuAndEachTokenIsIndependentOfTheOthers) {
  std::mt19937_64 rng(95);
  struct Shape {
    int64_t n, hidden, experts;
  };
  for (const Shape& s : {Shape{1, 64, 8}, Shape{5, 2048, 64}, Shape{9, 4, 1}, Shape{17, 516, 160}, Shape{32, 6144, 256},
                         Shape{32, 8192, 1024}, Shape{40, 256, 8}}) {
    const Bf16Data x = random_bf16(size_t(s.n) * s.hidden, rng);
    const std::vector<float> w = random_f32(size_t(s.experts) * s.hidden, rng, -0.1f, 0.1f);
    std::vector<float> want(size_t(s.n) * s.experts);
    for (int64_t t = 0; t < s.n; ++t)
      for (int64_t e = 0; e < s.experts; ++e) {
        double acc = 0;
        for (int64_t k = 0; k < s.hidden; ++k) acc += double(x.values[t * s.hidden + k]) * w[e * s.hidden + k];
        want[t * s.experts + e] = static_cast<float>(acc);
      }
    DeviceBuffer<uint16_t> dx(x.bits);
    DeviceBuffer<float> dw(w), dy(want.size());
    dy.poison();
    KILN_STATUS_OK(cuda::moe_gate_logits_bf16(dx.get(), s.n, s.hidden, dw.get(), s.experts, dy.get(), nullptr));
    const auto all = dy.download();
    const std::string what =
        "n " + std::to_string(s.n) + " hidden " + std::to_string(s.hidden) + " experts " + std::to_string(s.experts);
    EXPECT_LT(rel_error(all, want), kTol) << what;  // poison is NaN: every logit written
    for (int64_t t = 0; t < s.n; ++t) {
      KILN_STATUS_OK(
          cuda::moe_gate_logits_bf16(dx.get() + t * s.hidden, 1, s.hidden, dw.get(), s.experts, dy.get(), nullptr));
      const auto alone = dy.download();
      EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + t * s.experts, s.experts * sizeof(float)))
          << what << ": token " << t;
    }
  }
}

TEST(GpuMoeGateGemv, RejectsWhatItCannotRun) {
  DeviceBuffer<uint16_t> x(64);
  DeviceBuffer<float> w(64), y(64);
  EXPECT_FALSE(cuda::moe_gate_logits_bf16(x.get(), 1, 6, w.get(), 8, y.get(), nullptr).ok());      // hidden % 4
  EXPECT_FALSE(cuda::moe_gate_logits_bf16(x.get(), 1, 8, w.get() + 1, 8, y.get(), nullptr).ok());  // w alignment
  EXPECT_FALSE(cuda::moe_gate_logits_bf16(x.get(), 1, 8, w.get(), 0, y.get(), nullptr).ok());      // no experts
  EXPECT_TRUE(cuda::moe_gate_logits_bf16(x.get(), 0, 8, w.get(), 8, y.get(), nullptr).ok());       // nothing to do
}

}  // namespace
}  // namespace kiln::test
