// The fused MoE gate GEMV + router + grouping (one launch, the last block routing) against the two launches it
// replaces (moe_gate_logits_bf16, then moe_route_and_group): logits, ids, weights and dispatch lists bit for bit,
// ids and weights also against the CPU router on the GPU's logits; several calls on one counter, which the kernel
// must leave at zero.
#include "kernels/cuda/moe_gate_route_group.h"

#include <gtest/gtest.h>

#include "device_buffer.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_gate_gemv.h"
#include "kernels/cuda/moe_route_group.h"

namespace kiln::test {
namespace {

TEST(GpuMoeGateRouteGroup, MatchesTheGateGemvAndRouteGroupBitwise) {
  std::mt19937_64 rng(98);
  struct Case {
    cpu::MoeRouterConfig config;
    int64_t n, hidden;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{64, 4, 1, 1, true, 1.8f}, 1, 2048, true},     // GLM-4.7-Flash, one decode token
      {{64, 4, 1, 1, true, 1.8f}, 16, 2048, true},    // the largest fused batch
      {{64, 4, 1, 1, true, 1.8f}, 9, 516, true},      // hidden not a multiple of the gate's stride
      {{256, 8, 8, 4, true, 2.5f}, 13, 1024, true},   // DeepSeek-V3 group-limited
      {{60, 6, 1, 1, false, 1.0f}, 7, 64, false},     // E not a multiple of 8 experts a block
      {{1024, 8, 1, 1, true, 1.0f}, 16, 256, true},   // largest E: fewer routing warps than tokens
      // Up to 32 pairs the lists come from group_pairs_small: its edges.
      {{64, 4, 1, 1, true, 1.8f}, 8, 2048, true},     // 32 pairs
      {{256, 8, 8, 4, true, 2.5f}, 2, 1024, true},    // 16 pairs, group-limited
      {{1024, 8, 1, 1, true, 1.0f}, 4, 256, true},    // 32 pairs over the largest E
      {{60, 6, 1, 1, false, 1.0f}, 5, 64, false},     // 30 pairs
  };
  DeviceBuffer<unsigned> done(std::vector<unsigned>{0});
  for (const auto& c : cases) {
    const int64_t e = c.config.num_experts, pairs = c.n * c.config.top_k;
    const Bf16Data x = random_bf16(size_t(c.n) * c.hidden, rng);
    const std::vector<float> w = random_f32(size_t(e) * c.hidden, rng, -0.1f, 0.1f);
    const std::vector<float> bias = c.bias ? random_f32(e, rng, -0.1f, 0.1f) : std::vector<float>(e, 0.f);
    DeviceBuffer<uint16_t> dx(x.bits);
    DeviceBuffer<float> dw(w), db(bias), dl(size_t(c.n) * e), dl2(dl.size()), dwt(pairs), dwt2(pairs);
    DeviceBuffer<int32_t> dids(pairs), offsets(e + 1), active(e), order(pairs);
    DeviceBuffer<int32_t> dids2(pairs), offsets2(e + 1), active2(e), order2(pairs);
    const float* bias_ptr = c.bias ? db.get() : nullptr;
    const std::string what = "E " + std::to_string(e) + " n " + std::to_string(c.n) + " hidden " +
                             std::to_string(c.hidden);
    ASSERT_TRUE(cuda::moe_gate_route_and_group_supported(dx.get(), c.n, c.hidden, dw.get(), c.config)) << what;
    KILN_STATUS_OK(cuda::moe_gate_logits_bf16(dx.get(), c.n, c.hidden, dw.get(), e, dl2.get(), nullptr));
    KILN_STATUS_OK(cuda::moe_route_and_group(dl2.get(), bias_ptr, c.n, c.config, dids2.get(), dwt2.get(),
                                             {offsets2.get(), active2.get(), order2.get()}, nullptr));
    for (int call = 0; call < 2; ++call) {  // the second call finds the counter the first left
      for (auto* b : {&dids, &offsets, &active, &order}) b->poison();
      dl.poison();
      dwt.poison();
      KILN_STATUS_OK(cuda::moe_gate_route_and_group(dx.get(), c.n, c.hidden, dw.get(), dl.get(), bias_ptr, c.config,
                                                    dids.get(), dwt.get(), {offsets.get(), active.get(), order.get()},
                                                    done.get(), nullptr));
      KILN_CUDA_OK(cudaDeviceSynchronize());
      const auto logits = dl.download();
      EXPECT_EQ(logits, dl2.download()) << what << " call " << call;
      std::vector<int32_t> want_ids(pairs);
      std::vector<float> want_w(pairs);
      cpu::moe_route(logits.data(), c.bias ? bias.data() : nullptr, c.n, c.config, want_ids.data(), want_w.data());
      EXPECT_EQ(dids.download(), want_ids) << what;
      EXPECT_LT(rel_error(dwt.download(), want_w), 1e-5) << what;
      EXPECT_EQ(dids.download(), dids2.download()) << what;
      EXPECT_EQ(dwt.download(), dwt2.download()) << what;
      EXPECT_EQ(offsets.download(), offsets2.download()) << what;
      EXPECT_EQ(active.download(), active2.download()) << what;
      EXPECT_EQ(order.download(), order2.download()) << what;
      // And against the grouping kernel of the expert launches (block scans over slices, another implementation).
      DeviceBuffer<int32_t> offsets3(e + 1), active3(e), order3(pairs);
      KILN_STATUS_OK(cuda::moe_group_by_expert(dids2.get(), pairs, e, {offsets3.get(), active3.get(), order3.get()},
                                               nullptr));
      EXPECT_EQ(offsets.download(), offsets3.download()) << what;
      EXPECT_EQ(active.download(), active3.download()) << what;
      EXPECT_EQ(order.download(), order3.download()) << what;
      EXPECT_EQ(done.download(), std::vector<unsigned>{0}) << what;
    }
  }
}

TEST(GpuMoeGateRouteGroup, RejectsWhatItCannotRun) {
  DeviceBuffer<uint16_t> x(64);
  DeviceBuffer<float> w(1024);
  const cpu::MoeRouterConfig ok{8, 2, 1, 1, true, 1.f};
  EXPECT_FALSE(cuda::moe_gate_route_and_group_supported(x.get(), 17, 64, w.get(), ok));      // n > 16
  EXPECT_FALSE(cuda::moe_gate_route_and_group_supported(x.get(), 1, 6, w.get(), ok));        // hidden % 4
  EXPECT_FALSE(cuda::moe_gate_route_and_group_supported(x.get(), 1, 64, w.get() + 1, ok));   // w alignment
  EXPECT_FALSE(cuda::moe_gate_route_and_group_supported(x.get(), 1, 64, w.get(), {2048, 4, 1, 1, true, 1.f}));
  EXPECT_TRUE(cuda::moe_gate_route_and_group_supported(x.get(), 16, 64, w.get(), ok));
}

}  // namespace
}  // namespace kiln::test
