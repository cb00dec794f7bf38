// MoE router and the grouped expert GEMV path (gate_up+SwiGLU, down, combine) against the CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "device_buffer.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_router.h"
#include "moe_reference.h"

namespace kiln::test {
namespace {

TEST(GpuMoeRouter, IdsExactWeightsCloseToCpu) {
  std::mt19937_64 rng(61);
  struct Case {
    cpu::MoeRouterConfig config;
    int64_t n;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{64, 4, 1, 1, true, 1.8f}, 1, true},    // GLM-4.7-Flash
      {{64, 4, 1, 1, true, 1.8f}, 37, true},
      {{256, 8, 8, 4, true, 2.5f}, 9, true},   // DeepSeek-V3 group-limited
      {{288, 8, 1, 1, false, 1.0f}, 5, false}, // GLM-5.3 shapes, no normalisation
  };
  for (const auto& c : cases) {
    const int64_t e = c.config.num_experts;
    const std::vector<float> logits = random_f32(size_t(c.n) * e, rng, -4.f, 4.f);
    const std::vector<float> bias = random_f32(e, rng, -0.1f, 0.1f);
    std::vector<int32_t> want_ids(size_t(c.n) * c.config.top_k);
    std::vector<float> want_w(want_ids.size());
    cpu::moe_route(logits.data(), c.bias ? bias.data() : nullptr, c.n, c.config, want_ids.data(), want_w.data());
    DeviceBuffer<float> dl(logits), db(bias), dw(want_w.size());
    DeviceBuffer<int32_t> dids(want_ids.size());
    dw.poison();
    dids.poison();
    KILN_STATUS_OK(cuda::moe_route(dl.get(), c.bias ? db.get() : nullptr, c.n, c.config, dids.get(), dw.get(), nullptr));
    EXPECT_EQ(dids.download(), want_ids) << "E " << e;
    EXPECT_LT(rel_error(dw.download(), want_w), 1e-5);
  }
}

// The dispatch is exactly a stable counting sort of the pairs by expert: decode sizes, prefill sizes (tens of
// thousands of pairs over the grouping's slices), 1024 experts, and every pair on one expert.
TEST(GpuMoeExperts, GroupingIsAStableSortByExpert) {
  std::mt19937_64 rng(63);
  for (auto [pairs, experts, one_expert] : {std::tuple{int64_t(1), 8, false}, {int64_t(37), 64, false},
                                            {int64_t(65536), 64, false}, {int64_t(16387), 1024, false},
                                            {int64_t(4099), 16, true}}) {
    std::vector<int32_t> ids(pairs);
    for (auto& id : ids) id = one_expert ? 7 : static_cast<int32_t>(rng() % experts);
    std::vector<int32_t> want_offsets(experts + 1, 0), want_active(experts, -1), want_order(pairs);
    for (int32_t id : ids) ++want_offsets[id + 1];
    for (int e = 0, a = 0; e < experts; ++e) {
      if (want_offsets[e + 1] > 0) want_active[a++] = e;
      want_offsets[e + 1] += want_offsets[e];
    }
    std::iota(want_order.begin(), want_order.end(), 0);
    std::stable_sort(want_order.begin(), want_order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });

    DeviceBuffer<int32_t> dids(ids), offsets(experts + 1), active(experts), order(pairs);
    for (auto* b : {&offsets, &active, &order}) b->poison();
    KILN_STATUS_OK(cuda::moe_group_by_expert(dids.get(), pairs, experts, {offsets.get(), active.get(), order.get()},
                                             nullptr));
    EXPECT_EQ(offsets.download(), want_offsets) << pairs << " pairs, " << experts << " experts";
    EXPECT_EQ(active.download(), want_active) << pairs << " pairs, " << experts << " experts";
    EXPECT_EQ(order.download(), want_order) << pairs << " pairs, " << experts << " experts";
  }
}

struct ExpertCase {
  int64_t experts, top_k, n, hidden, inter;
  int32_t hot_expert;  // ≥ 0: every token routes to it (one expert with n rows, more than a 64-row pass when n > 64)
};

// The grouped path (group, gate_up + SwiGLU, down, combine) vs the CPU; run twice, bit-identical (the per-warp
// partials are summed in a fixed order). Outputs are poisoned (NaN) first, so an element not written fails.
void run_expert_case(const ExpertCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto [experts, top_k, n, hidden, inter, hot] = c;
  const Bf16Data x = random_bf16(size_t(n) * hidden, rng);
  const Bf16Data gate_up = random_bf16(size_t(experts) * 2 * inter * hidden, rng, -0.1f, 0.1f);
  const Bf16Data down = random_bf16(size_t(experts) * hidden * inter, rng, -0.1f, 0.1f);
  std::vector<int32_t> ids(size_t(n) * top_k);
  for (int64_t t = 0; t < n; ++t) {  // distinct experts per token, as the router gives
    std::vector<int32_t> all(experts);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    if (hot >= 0) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), hot));
    std::copy(all.begin(), all.begin() + top_k, ids.begin() + t * top_k);
  }
  const std::vector<float> route_w = random_f32(ids.size(), rng, 0.1f, 1.f);
  const Bf16Data shared = random_bf16(size_t(n) * hidden, rng);

  const int64_t pairs = n * top_k;
  const MoeReference ref = moe_reference(x.values, n, top_k, hidden, inter, gate_up.values, down.values, ids, route_w,
                                         shared.values, INFINITY);
  const std::vector<float>& want_h = ref.h;
  const std::vector<float>& want = ref.out;

  DeviceBuffer<uint16_t> dx(x.bits), dgu(gate_up.bits), ddown(down.bits), dshared(shared.bits);
  DeviceBuffer<uint16_t> dh(size_t(pairs) * inter), dout(size_t(n) * hidden);
  DeviceBuffer<int32_t> dids(ids), offsets(experts + 1), active(experts), order(pairs);
  DeviceBuffer<float> drw(route_w), dy(size_t(pairs) * hidden);
  std::vector<uint16_t> first_h, first_out;
  for (int run = 0; run < 2; ++run) {
    dh.poison();
    dout.poison();
    dy.poison();
    const cuda::MoeDispatch d{offsets.get(), active.get(), order.get()};
    KILN_STATUS_OK(cuda::moe_group_by_expert(dids.get(), pairs, experts, d, nullptr));
    KILN_STATUS_OK(cuda::moe_gate_up_swiglu_bf16(dx.get(), n, top_k, hidden, inter, dgu.get(), experts, d, INFINITY,
                                                 dh.get(), nullptr));
    KILN_STATUS_OK(cuda::moe_down_bf16(dh.get(), pairs, inter, hidden, ddown.get(), experts, d, drw.get(), dy.get(),
                                       nullptr));
    KILN_STATUS_OK(cuda::moe_combine_bf16(dy.get(), n, top_k, hidden, dshared.get(), dout.get(), nullptr));
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got_h = dh.download(), got_out = dout.download();
    if (run == 0) {
      EXPECT_LT(rel_error(widen(got_h), want_h), 1e-2) << experts << "/" << n << "/" << hidden << "/" << inter;
      EXPECT_LT(rel_error(widen(got_out), want), 1e-2) << experts << "/" << n << "/" << hidden << "/" << inter;
      for (float v : widen(got_out)) ASSERT_TRUE(std::isfinite(v)) << "an output element was not written";
      first_h = got_h, first_out = got_out;
    } else {
      EXPECT_EQ(got_h, first_h) << "h differs between two identical runs";
      EXPECT_EQ(got_out, first_out) << "output differs between two identical runs";
    }
    // The grouping lists every pair exactly once.
    std::vector<int32_t> seen = order.download();
    std::sort(seen.begin(), seen.end());
    for (int64_t p = 0; p < pairs; ++p) ASSERT_EQ(seen[p], p);
  }

  // Batch invariance (the serving engine relies on it): the last token alone gives bit for bit what it got in
  // the batch, whatever the other rows of its experts.
  const int64_t t = n - 1;
  const std::vector<int32_t> ids1(ids.begin() + t * top_k, ids.begin() + (t + 1) * top_k);
  const std::vector<float> rw1(route_w.begin() + t * top_k, route_w.begin() + (t + 1) * top_k);
  DeviceBuffer<uint16_t> dx1(std::vector<uint16_t>(x.bits.begin() + t * hidden, x.bits.begin() + (t + 1) * hidden));
  DeviceBuffer<uint16_t> dshared1(
      std::vector<uint16_t>(shared.bits.begin() + t * hidden, shared.bits.begin() + (t + 1) * hidden));
  DeviceBuffer<uint16_t> dh1(size_t(top_k) * inter), dout1(hidden);
  DeviceBuffer<int32_t> dids1(ids1), order1(top_k);
  DeviceBuffer<float> drw1(rw1), dy1(size_t(top_k) * hidden);
  const cuda::MoeDispatch d1{offsets.get(), active.get(), order1.get()};
  KILN_STATUS_OK(cuda::moe_group_by_expert(dids1.get(), top_k, experts, d1, nullptr));
  KILN_STATUS_OK(cuda::moe_gate_up_swiglu_bf16(dx1.get(), 1, top_k, hidden, inter, dgu.get(), experts, d1, INFINITY,
                                               dh1.get(), nullptr));
  KILN_STATUS_OK(cuda::moe_down_bf16(dh1.get(), top_k, inter, hidden, ddown.get(), experts, d1, drw1.get(),
                                     dy1.get(), nullptr));
  KILN_STATUS_OK(cuda::moe_combine_bf16(dy1.get(), 1, top_k, hidden, dshared1.get(), dout1.get(), nullptr));
  EXPECT_EQ(dh1.download(), std::vector<uint16_t>(first_h.begin() + t * top_k * inter,
                                                  first_h.begin() + (t + 1) * top_k * inter))
      << "h of a token alone differs from the batch";
  EXPECT_EQ(dout1.download(), std::vector<uint16_t>(first_out.begin() + t * hidden, first_out.begin() + (t + 1) * hidden))
      << "output of a token alone differs from the batch";
}

TEST(GpuMoeExperts, GroupedPathMatchesCpu) {
  // Odd sizes: hidden 2056 / 520 / 264 are not multiples of the 16-row down tile nor of the 32-wide k chunk.
  const std::vector<ExpertCase> cases = {
      {8, 2, 1, 256, 96, -1},    {16, 4, 9, 512, 200, -1}, {16, 4, 3, 2048, 1536, -1}, {4, 4, 6, 64, 8, -1},
      {8, 2, 5, 2056, 136, -1},  {8, 4, 2, 2056, 136, -1}, {64, 4, 16, 520, 136, -1},  // most experts: 0 rows
      {4, 2, 40, 136, 40, -1},  // 20 rows per expert: 4 n8 tiles per pass
  };
  for (size_t i = 0; i < cases.size(); ++i) run_expert_case(cases[i], 62 + i);
}

TEST(GpuMoeExperts, ManyRowsOnOneExpertMatchCpu) {
  run_expert_case({64, 4, 64, 520, 136, 0}, 80);  // expert 0 has all 64 tokens (one full pass), the rest few
  run_expert_case({8, 1, 64, 264, 72, 3}, 81);    // all 64 tokens to expert 3 only; the other experts idle
  run_expert_case({8, 4, 70, 136, 40, 5}, 82);    // 70 rows: two passes over each weight tile
}

}  // namespace
}  // namespace kiln::test
