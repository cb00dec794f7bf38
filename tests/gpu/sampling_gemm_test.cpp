// argmax and the cuBLAS linear against the CPU reference (sampling: token_select_test.cpp).
#include <gtest/gtest.h>

#include "device_buffer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/sampling.h"

namespace kiln::test {
namespace {

TEST(GpuSampling, ArgmaxMatchesCpu) {
  std::mt19937_64 rng(71);
  for (auto [rows, vocab] : {std::pair{3, 154880}, {5, 1001}, {1, 1}}) {
    std::vector<float> logits = random_f32(size_t(rows) * vocab, rng, -10.f, 10.f);
    if (vocab > 10) logits[3] = NAN;
    std::vector<int32_t> want(rows);
    for (int64_t r = 0; r < rows; ++r) want[r] = cpu::argmax(logits.data() + r * vocab, vocab);
    DeviceBuffer<float> dl(logits);
    DeviceBuffer<int32_t> dout(rows);
    dout.poison();
    KILN_STATUS_OK(cuda::argmax_rows(dl.get(), rows, vocab, dout.get(), nullptr));
    EXPECT_EQ(dout.download(), want);
  }
}

TEST(GpuGemm, CublasLinearMatchesCpu) {
  std::mt19937_64 rng(81);
  auto gemm = cuda::CublasGemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  for (auto [n, in, out] : {std::tuple{1, 2048, 3000}, {7, 768, 1001}, {64, 512, 576}}) {
    const Bf16Data x = random_bf16(size_t(n) * in, rng);
    const Bf16Data w = random_bf16(size_t(out) * in, rng, -0.05f, 0.05f);
    std::vector<float> want(size_t(n) * out);
    cpu::gemm_bf16(x.values.data(), n, in, w.bits.data(), out, want.data());
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dy16(want.size());
    DeviceBuffer<float> dy32(want.size());
    dy16.poison();
    dy32.poison();
    KILN_STATUS_OK((*gemm)->linear(dx.get(), n, in, dw.get(), out, dy16.get(), DType::kBF16, nullptr));
    KILN_STATUS_OK((*gemm)->linear(dx.get(), n, in, dw.get(), out, dy32.get(), DType::kF32, nullptr));
    EXPECT_LT(rel_error(widen(dy16.download()), want), 1e-2);
    EXPECT_LT(rel_error(dy32.download(), want), 1e-4);
  }
}

}  // namespace
}  // namespace kiln::test
