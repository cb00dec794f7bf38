// The kv_b expansion's head-batched cuBLASLt GEMM (kernels/cuda/head_batched_gemm.h) against a double-precision CPU
// product, and the property it exists for: a head's bits do not depend on how many heads share the launch (a
// tensor-parallel rank expands only its own heads and must get the one-rank bits) — nor on whether the head runs
// alone, as the per-head cuBLAS form ran every head.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "device_buffer.h"
#include "kv_expansion_reference.h"
#include "kernels/cuda/head_batched_gemm.h"

namespace kiln::test {
namespace {

using BatchedCase = KvExpansionShape;

// Heads [h0, h0 + hs) of the case over all its keys: bf16 [hs][keys][head_width], or {} with `status` set when
// cuBLASLt declines the problem.
std::vector<uint16_t> expand(const BatchedCase& c, const DeviceBuffer<uint16_t>& latent, const Bf16Data& kv_b,
                             int64_t h0, int64_t hs, Status& status) {
  const std::vector<uint16_t> w(kv_b.bits.begin() + h0 * c.head_width * c.latent,
                                kv_b.bits.begin() + (h0 + hs) * c.head_width * c.latent);
  DeviceBuffer<uint16_t> dw(w), dout(size_t(hs * c.keys * c.head_width));
  DeviceBuffer<uint8_t> ws(cuda::kHeadBatchedGemmWorkspaceBytes);
  dout.poison();
  status = cuda::head_batched_gemm_bf16(latent.get(), c.keys, c.latent, c.row_width, dw.get(), c.head_width, hs,
                                        dout.get(), ws.get(), nullptr);
  if (!status.ok()) return {};
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return dout.download();
}

void run_case(const BatchedCase& c, uint64_t seed, bool must_run) {
  std::mt19937_64 rng(seed);
  const Bf16Data latent = random_bf16(size_t(c.keys * c.row_width), rng);
  const Bf16Data kv_b = random_bf16(size_t(c.heads * c.head_width * c.latent), rng, -0.1f, 0.1f);
  const DeviceBuffer<uint16_t> dlat(latent.bits);
  Status st;
  const std::vector<uint16_t> whole = expand(c, dlat, kv_b, 0, c.heads, st);
  if (!st.ok()) {
    EXPECT_FALSE(must_run) << st.to_string();
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();  // the caller's cue to run one GEMM a head
    return;
  }

  // Every 7th key of long cases (the CPU's double sums dominate the time).
  expect_exact_kv_expansion(c, latent, kv_b, whole,
                            c.keys > 1000 ? 7 : 1);

  // 2- and 3-rank splits of the heads, and every head alone: the bits of the all-heads launch.
  for (int parts : {2, 3, static_cast<int>(c.heads)}) {
    if (parts > c.heads) continue;
    for (int r = 0; r < parts; ++r) {
      const int64_t h0 = c.heads * r / parts, hs = c.heads * (r + 1) / parts - h0;
      const std::vector<uint16_t> part = expand(c, dlat, kv_b, h0, hs, st);
      ASSERT_TRUE(st.ok()) << st.to_string();
      int64_t differ = 0;
      for (int64_t i = 0; i < hs * c.keys * c.head_width; ++i)
        differ += part[i] != whole[h0 * c.keys * c.head_width + i];
      EXPECT_EQ(differ, 0) << "heads " << h0 << ".." << h0 + hs << " of " << parts << " ranks";
    }
  }
}

TEST(GpuHeadBatchedGemm, GlmShapesMatchTheExactProductAndKeepEachHeadsBits) {
  run_case({20, 448, 512, 576, 4099}, 1, true);  // GLM-4.7-Flash: nope 192 + v 256, latent 512 + rope 64
  run_case({20, 448, 512, 576, 65}, 2, true);    // just past the skinny GEMM's key limit (64)
}

TEST(GpuHeadBatchedGemm, OtherShapesMatchTheExactProductAndKeepEachHeadsBits) {
  run_case({16, 256, 512, 576, 1500}, 3, false);  // DeepSeek-V3's head shapes, a rank's share
  run_case({8, 64, 128, 144, 700}, 4, false);     // models/tiny-glm
  run_case({5, 130, 200, 264, 333}, 5, false);    // odd widths
  run_case({3, 6, 72, 80, 65}, 6, false);         // narrow heads
}

TEST(GpuHeadBatchedGemm, RejectsBadShapes) {
  DeviceBuffer<uint8_t> ws(64);
  EXPECT_FALSE(cuda::head_batched_gemm_bf16(nullptr, 0, 8, 8, nullptr, 8, 1, nullptr, ws.get(), nullptr).ok());
  EXPECT_FALSE(cuda::head_batched_gemm_bf16(nullptr, 8, 16, 8, nullptr, 8, 1, nullptr, ws.get(), nullptr).ok());
  EXPECT_FALSE(cuda::head_batched_gemm_bf16(nullptr, 8, 8, 8, nullptr, 8, 0, nullptr, ws.get(), nullptr).ok());
  EXPECT_FALSE(cuda::head_batched_gemm_bf16(nullptr, 8, 8, 8, nullptr, 8, 1, nullptr, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace kiln::test
