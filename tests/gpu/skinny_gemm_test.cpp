// The few-row tensor-core GEMM (decode projections) and CublasGemm::linear's dispatch to it, against the CPU
// reference: every tile shape (n up to 64, one or two 16-row tiles per block, 8 or 16 warps), odd sizes, k
// tails, bf16 / fp32 outputs, accumulate.
#include <gtest/gtest.h>

#include <tuple>

#include "device_buffer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/skinny_gemm.h"

namespace kiln::test {
namespace {

// fp32 output: only the summation order differs from the CPU (< 1e-5 relative); bf16 output adds one rounding
// (2^-8 relative per element, < 5e-3 over a vector).
constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 5e-3;

struct Shape {
  int64_t n, in, out;
};

void check_shape(const Shape& s, int sm_count, std::mt19937_64& rng) {
  const Bf16Data x = random_bf16(size_t(s.n) * s.in, rng);
  const Bf16Data w = random_bf16(size_t(s.out) * s.in, rng, -0.05f, 0.05f);
  const Bf16Data y0 = random_bf16(size_t(s.n) * s.out, rng);  // what accumulate adds to
  std::vector<float> want(size_t(s.n) * s.out), want_acc(want.size());
  cpu::gemm_bf16(x.values.data(), s.n, s.in, w.bits.data(), s.out, want.data());
  for (size_t i = 0; i < want.size(); ++i) want_acc[i] = want[i] + y0.values[i];
  DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dy16(want.size());
  DeviceBuffer<float> dy32(want.size());
  const std::string what = "n " + std::to_string(s.n) + " in " + std::to_string(s.in) + " out " +
                           std::to_string(s.out) + " sms " + std::to_string(sm_count);

  dy16.poison();
  dy32.poison();
  KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), s.n, s.in, dw.get(), s.out, dy16.get(), DType::kBF16, false,
                                        sm_count, nullptr));
  KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), s.n, s.in, dw.get(), s.out, dy32.get(), DType::kF32, false,
                                        sm_count, nullptr));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(rel_error(widen(dy16.download()), want), kTolBf16) << what;  // poison is NaN: every element written
  EXPECT_LT(rel_error(dy32.download(), want), kTolF32) << what;

  dy16.upload(y0.bits);
  dy32.upload(y0.values);
  KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), s.n, s.in, dw.get(), s.out, dy16.get(), DType::kBF16, true,
                                        sm_count, nullptr));
  KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), s.n, s.in, dw.get(), s.out, dy32.get(), DType::kF32, true,
                                        sm_count, nullptr));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(rel_error(widen(dy16.download()), want_acc), kTolBf16) << what << " accumulate";
  EXPECT_LT(rel_error(dy32.download(), want_acc), kTolF32) << what << " accumulate";
}

TEST(GpuSkinnyGemm, MatchesCpuOnEveryTileShape) {
  std::mt19937_64 rng(91);
  const std::vector<Shape> shapes = {
      {1, 2048, 768},  {1, 8, 1},      {3, 776, 1001}, {8, 520, 17},   {9, 2048, 576},
      {16, 1536, 33},  {17, 264, 130}, {32, 5120, 64}, {33, 96, 2048}, {64, 256, 100},
  };
  // sm_count steers the block shape: 1 → two 16-row tiles per block wherever out ≥ 64; 100000 → one tile and
  // 16 warps; 132 → what an H200 gets.
  for (const Shape& s : shapes)
    for (int sms : {1, 132, 100000}) check_shape(s, sms, rng);
}

TEST(GpuSkinnyGemm, RejectsWhatItCannotRun) {
  DeviceBuffer<uint16_t> buf(4096);
  float* y = nullptr;
  EXPECT_FALSE(cuda::skinny_gemm_supported(buf.get(), 65, 64, buf.get()));
  EXPECT_FALSE(cuda::skinny_gemm_supported(buf.get(), 1, 12, buf.get()));
  EXPECT_FALSE(cuda::skinny_gemm_supported(buf.get() + 1, 1, 64, buf.get()));
  EXPECT_TRUE(cuda::skinny_gemm_supported(buf.get(), 64, 64, buf.get()));
  EXPECT_FALSE(cuda::skinny_gemm_bf16(buf.get(), 0, 64, buf.get(), 8, y, DType::kF32, false, 132, nullptr).ok());
}

// linear() keeps its contract whichever path runs: skinny where skinny_gemm_preferred, cuBLAS elsewhere or for
// operands the skinny kernel cannot take (in % 8 != 0).
TEST(GpuSkinnyGemm, LinearDispatchMatchesCpu) {
  std::mt19937_64 rng(92);
  auto gemm = cuda::CublasGemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  for (auto [n, in, out] : {std::tuple{1, 2048, 3000}, {4, 5120, 2048}, {32, 768, 640}, {33, 512, 300},
                            {5, 12, 50}, {2, 2048, 40000}, {16, 256, 20000}}) {
    const Bf16Data x = random_bf16(size_t(n) * in, rng);
    const Bf16Data w = random_bf16(size_t(out) * in, rng, -0.05f, 0.05f);
    const Bf16Data y0 = random_bf16(size_t(n) * out, rng);
    std::vector<float> want(size_t(n) * out);
    cpu::gemm_bf16(x.values.data(), n, in, w.bits.data(), out, want.data());
    for (size_t i = 0; i < want.size(); ++i) want[i] += y0.values[i];
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dy16(y0.bits);
    DeviceBuffer<float> dy32(y0.values);
    KILN_STATUS_OK((*gemm)->linear(dx.get(), n, in, dw.get(), out, dy16.get(), DType::kBF16, nullptr, true));
    KILN_STATUS_OK((*gemm)->linear(dx.get(), n, in, dw.get(), out, dy32.get(), DType::kF32, nullptr, true));
    EXPECT_LT(rel_error(widen(dy16.download()), want), kTolBf16) << n << "/" << in << "/" << out;
    EXPECT_LT(rel_error(dy32.download(), want), 1e-4) << n << "/" << in << "/" << out;  // cuBLAS: 1e-4 as before
  }
}

}  // namespace
}  // namespace kiln::test
