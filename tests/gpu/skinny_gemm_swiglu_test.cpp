// The skinny GEMM with SwiGLU in its epilogue (decode's shared expert and dense MLP gate_up) against the CPU
// reference, against the two-kernel path it replaces (skinny GEMM into bf16 gate_up, then swiglu_bf16), and for
// batch invariance; odd widths (partial 16-row tiles), k tails, clamped and unclamped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "device_buffer.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/skinny_gemm.h"

namespace kiln::test {
namespace {

// gate and up are rounded to bf16 as on the CPU; a summation-order difference may move one of them by one bf16
// step, and act adds one rounding: < 5e-3 relative over a vector.
constexpr double kTolBf16 = 5e-3;

struct Case {
  int64_t n, in, inter;
  float limit;
};

// What the CPU model computes: gate_up = bf16(x · Wᵀ), act = swiglu(gate, up).
std::vector<float> cpu_swiglu_mlp(const Bf16Data& x, const Bf16Data& w, const Case& c) {
  std::vector<float> gu(size_t(c.n) * 2 * c.inter), want(size_t(c.n) * c.inter);
  cpu::gemm_bf16(x.values.data(), c.n, c.in, w.bits.data(), 2 * c.inter, gu.data());
  for (float& v : gu) v = cpu::bf16_to_float(cpu::float_to_bf16(v));
  cpu::swiglu(gu.data(), gu.data() + c.inter, c.n, c.inter, 2 * c.inter, want.data(), c.limit);
  return want;
}

TEST(GpuSkinnyGemmSwiglu, MatchesCpuAndTheTwoKernelPath) {
  std::mt19937_64 rng(95);
  for (const Case& c : {Case{1, 2048, 1536, INFINITY}, Case{3, 776, 37, INFINITY}, Case{8, 520, 17, 0.5f},
                        Case{9, 264, 100, INFINITY}, Case{16, 2048, 40, 0.25f}, Case{17, 96, 1000, INFINITY},
                        Case{32, 1032, 250, INFINITY}}) {
    const Bf16Data x = random_bf16(size_t(c.n) * c.in, rng);
    const Bf16Data w = random_bf16(size_t(2 * c.inter) * c.in, rng, -0.05f, 0.05f);
    const std::vector<float> want = cpu_swiglu_mlp(x, w, c);
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dact(want.size()), dgu(size_t(c.n) * 2 * c.inter),
        dref(want.size());
    const std::string what = "n " + std::to_string(c.n) + " in " + std::to_string(c.in) + " inter " +
                             std::to_string(c.inter) + " limit " + std::to_string(c.limit);
    dact.poison();
    KILN_STATUS_OK(cuda::skinny_gemm_swiglu_bf16(dx.get(), c.n, c.in, dw.get(), c.inter, dact.get(), nullptr, c.limit));
    // sm_count 1: the two-kernel path runs 8-warp blocks too, so the k-reductions are the same, bit for bit.
    KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), c.n, c.in, dw.get(), 2 * c.inter, dgu.get(), DType::kBF16, false,
                                          1, nullptr));
    KILN_STATUS_OK(
        cuda::swiglu_bf16(dgu.get(), dgu.get() + c.inter, c.n, c.inter, 2 * c.inter, dref.get(), nullptr, c.limit));
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const auto act = dact.download();
    EXPECT_LT(rel_error(widen(act), want), kTolBf16) << what;  // poison is NaN: every element written
    EXPECT_EQ(0, std::memcmp(act.data(), dref.download().data(), act.size() * sizeof(uint16_t))) << what;
  }
}

// Up to kSkinnyGemmMaxRows rows, a row's act is bitwise that of the row run alone.
TEST(GpuSkinnyGemmSwiglu, EachRowIsBitwiseIndependentOfTheOtherRows) {
  std::mt19937_64 rng(96);
  constexpr int64_t kRows = cuda::kSkinnyGemmMaxRows;
  for (auto [in, inter] : {std::pair<int64_t, int64_t>{2048, 1536}, {520, 17}, {96, 1000}}) {
    const Bf16Data x = random_bf16(size_t(kRows) * in, rng);
    const Bf16Data w = random_bf16(size_t(2 * inter) * in, rng, -0.05f, 0.05f);
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dact(size_t(kRows) * inter);
    std::vector<uint16_t> alone(size_t(kRows) * inter);
    for (int64_t r = 0; r < kRows; ++r) {
      KILN_STATUS_OK(cuda::skinny_gemm_swiglu_bf16(dx.get() + r * in, 1, in, dw.get(), inter, dact.get(), nullptr));
      const auto a = dact.download();
      std::copy_n(a.begin(), inter, alone.begin() + r * inter);
    }
    for (int64_t n : {2, 7, 8, 9, 16, 17, 31, 32}) {
      dact.poison();
      KILN_STATUS_OK(cuda::skinny_gemm_swiglu_bf16(dx.get(), n, in, dw.get(), inter, dact.get(), nullptr));
      const auto a = dact.download();
      for (int64_t r = 0; r < n; ++r)
        EXPECT_EQ(0, std::memcmp(a.data() + r * inter, alone.data() + r * inter, inter * sizeof(uint16_t)))
            << "row " << r << " of " << n << ", in " << in << " inter " << inter;
    }
  }
}

TEST(GpuSkinnyGemmSwiglu, RejectsWhatItCannotRun) {
  DeviceBuffer<uint16_t> buf(1 << 16);
  EXPECT_FALSE(cuda::skinny_gemm_swiglu_bf16(buf.get(), cuda::kSkinnyGemmMaxRows + 1, 64, buf.get(), 8, buf.get(),
                                             nullptr)
                   .ok());
  EXPECT_FALSE(cuda::skinny_gemm_swiglu_bf16(buf.get(), 1, 12, buf.get(), 8, buf.get(), nullptr).ok());  // in % 8
  EXPECT_FALSE(cuda::skinny_gemm_swiglu_bf16(buf.get(), 1, 64, buf.get(), 0, buf.get(), nullptr).ok());
}

}  // namespace
}  // namespace kiln::test
