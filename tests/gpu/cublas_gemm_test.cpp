// The cuBLAS linear against the CPU reference (greedy and sampled token selection: token_select_test.cpp).
#include <gtest/gtest.h>

#include "device_buffer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gemm.h"

namespace kiln::test {
namespace {

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
