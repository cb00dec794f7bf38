// The fused MoE gate + grouping against the CPU router and against the two-launch path it replaces
// (moe_route then moe_group_by_expert): ids and dispatch lists identical, weights within 1e-5 of the CPU.
#include <gtest/gtest.h>

#include "device_buffer.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_route_group.h"
#include "kernels/cuda/moe_router.h"

namespace kiln::test {
namespace {

TEST(GpuMoeRouteGroup, MatchesCpuRouterAndTwoLaunchGrouping) {
  std::mt19937_64 rng(63);
  struct Case {
    cpu::MoeRouterConfig config;
    int64_t n;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{64, 4, 1, 1, true, 1.8f}, 1, true},     // GLM-4.7-Flash, one decode token
      {{64, 4, 1, 1, true, 1.8f}, 16, true},    // the largest fused batch
      {{64, 4, 1, 1, true, 1.8f}, 17, true},    // first batch on the two-launch path
      {{256, 8, 8, 4, true, 2.5f}, 13, true},   // DeepSeek-V3 group-limited
      {{288, 8, 1, 1, false, 1.0f}, 7, false},  // no normalisation, E not a power of two
      {{1024, 8, 1, 1, true, 1.0f}, 16, true},  // largest E: fewer routing warps (12) than tokens
      {{1024, 8, 1, 1, true, 1.0f}, 29, true},  // the same on the two-launch path
      {{64, 4, 1, 1, true, 1.8f}, 300, true},   // prefill-sized
  };
  for (const auto& c : cases) {
    const int64_t e = c.config.num_experts, pairs = c.n * c.config.top_k;
    std::vector<float> logits = random_f32(size_t(c.n) * e, rng, -4.f, 4.f);
    // Exact ties: the lower id must win, as on the CPU.
    for (int64_t t = 0; t < c.n; t += 3) logits[t * e + 5] = logits[t * e + 2];
    const std::vector<float> bias = c.bias ? random_f32(e, rng, -0.1f, 0.1f) : std::vector<float>(e, 0.f);
    std::vector<int32_t> want_ids(pairs);
    std::vector<float> want_w(pairs);
    cpu::moe_route(logits.data(), c.bias ? bias.data() : nullptr, c.n, c.config, want_ids.data(), want_w.data());

    DeviceBuffer<float> dl(logits), db(bias), dw(pairs), dw2(pairs);
    DeviceBuffer<int32_t> dids(pairs), offsets(e + 1), active(e), order(pairs);
    DeviceBuffer<int32_t> dids2(pairs), offsets2(e + 1), active2(e), order2(pairs);
    for (auto* b : {&dids, &offsets, &active, &order, &dids2, &offsets2, &active2, &order2}) b->poison();
    dw.poison();
    dw2.poison();
    const float* bias_ptr = c.bias ? db.get() : nullptr;
    KILN_STATUS_OK(cuda::moe_route_and_group(dl.get(), bias_ptr, c.n, c.config, dids.get(), dw.get(),
                                             {offsets.get(), active.get(), order.get()}, nullptr));
    KILN_STATUS_OK(cuda::moe_route(dl.get(), bias_ptr, c.n, c.config, dids2.get(), dw2.get(), nullptr));
    KILN_STATUS_OK(cuda::moe_group_by_expert(dids2.get(), pairs, e, {offsets2.get(), active2.get(), order2.get()},
                                             nullptr));
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::string what = "E " + std::to_string(e) + " n " + std::to_string(c.n);
    EXPECT_EQ(dids.download(), want_ids) << what;
    EXPECT_LT(rel_error(dw.download(), want_w), 1e-5) << what;
    EXPECT_EQ(dw.download(), dw2.download()) << what;
    EXPECT_EQ(offsets.download(), offsets2.download()) << what;
    EXPECT_EQ(active.download(), active2.download()) << what;
    EXPECT_EQ(order.download(), order2.download()) << what;
  }
}

TEST(GpuMoeRouteGroup, RejectsUnsupportedShapes) {
  DeviceBuffer<float> buf(16);
  DeviceBuffer<int32_t> ibuf(16);
  cpu::MoeRouterConfig bad{2048, 4, 1, 1, true, 1.f};
  EXPECT_FALSE(cuda::moe_route_and_group(buf.get(), nullptr, 1, bad, ibuf.get(), buf.get(),
                                         {ibuf.get(), ibuf.get(), ibuf.get()}, nullptr)
                   .ok());
}

}  // namespace
}  // namespace kiln::test
