// MoE router and the grouped expert GEMV path (gate_up+SwiGLU, down, combine) against the CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

#include "device_buffer.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/norm.h"
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

// How a case adds the shared expert: a bf16 tensor given to moe_combine (it ran apart), its own weights folded
// into the routed-expert launches (MoeSharedExpert), or none.
enum class Shared { kBf16Add, kFolded, kNone };

struct ExpertCase {
  int64_t experts, top_k, n, hidden, inter;
  int32_t hot_expert;  // ≥ 0: every token routes to it (one expert with n rows, more than a 64-row pass when n > 64)
  Shared shared = Shared::kBf16Add;
};

// The inputs of one case, on the host and the device.
struct ExpertInputs {
  Bf16Data x, gate_up, down, shared_gate_up, shared_down, add;
  std::vector<int32_t> ids;
  std::vector<float> route_w;
};

ExpertInputs make_inputs(const ExpertCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto [experts, top_k, n, hidden, inter, hot, shared] = c;
  ExpertInputs in;
  in.x = random_bf16(size_t(n) * hidden, rng);
  in.gate_up = random_bf16(size_t(experts) * 2 * inter * hidden, rng, -0.1f, 0.1f);
  in.down = random_bf16(size_t(experts) * hidden * inter, rng, -0.1f, 0.1f);
  in.ids.resize(size_t(n) * top_k);
  for (int64_t t = 0; t < n; ++t) {  // distinct experts per token, as the router gives
    std::vector<int32_t> all(experts);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    if (hot >= 0) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), hot));
    std::copy(all.begin(), all.begin() + top_k, in.ids.begin() + t * top_k);
  }
  in.route_w = random_f32(in.ids.size(), rng, 0.1f, 1.f);
  if (shared == Shared::kBf16Add) in.add = random_bf16(size_t(n) * hidden, rng);
  if (shared == Shared::kFolded) {
    in.shared_gate_up = random_bf16(size_t(2) * inter * hidden, rng, -0.1f, 0.1f);
    in.shared_down = random_bf16(size_t(hidden) * inter, rng, -0.1f, 0.1f);
  }
  return in;
}

// Device state for running the decode expert path on rows [t0, t0 + n) of a case's inputs.
struct ExpertRun {
  std::vector<uint16_t> h, shared_h, out;
  std::vector<float> y;  // routed pairs, then the folded shared expert's rows
};

void run_expert_path(const ExpertCase& c, const ExpertInputs& in, int64_t t0, int64_t n, ExpertRun& run) {
  const int64_t experts = c.experts, top_k = c.top_k, hidden = c.hidden, inter = c.inter, pairs = n * top_k;
  const bool folded = c.shared == Shared::kFolded, add = c.shared == Shared::kBf16Add;
  auto rows = [&](const auto& v, int64_t width, int64_t count) {
    return std::vector(v.begin() + t0 * width, v.begin() + (t0 + count) * width);
  };
  DeviceBuffer<uint16_t> dx(rows(in.x.bits, hidden, n)), dgu(in.gate_up.bits), ddown(in.down.bits);
  DeviceBuffer<uint16_t> dsgu(in.shared_gate_up.bits), dsdown(in.shared_down.bits);
  DeviceBuffer<uint16_t> dadd(add ? rows(in.add.bits, hidden, n) : std::vector<uint16_t>{});
  DeviceBuffer<uint16_t> dh(size_t(pairs) * inter), dsh(size_t(n) * inter), dout(size_t(n) * hidden);
  DeviceBuffer<int32_t> dids(rows(in.ids, top_k, n)), offsets(experts + 1), active(experts), order(pairs);
  DeviceBuffer<float> drw(rows(in.route_w, top_k, n)), dy(size_t(pairs + n) * hidden);
  for (auto* b : {&dh, &dsh, &dout}) b->poison();
  dy.poison();
  const cuda::MoeDispatch d{offsets.get(), active.get(), order.get()};
  const cuda::MoeSharedExpert shared{dsgu.get(), dsdown.get(), n, dsh.get(), dy.get() + pairs * hidden};
  const cuda::MoeSharedExpert* s = folded ? &shared : nullptr;
  KILN_STATUS_OK(cuda::moe_group_by_expert(dids.get(), pairs, experts, d, nullptr));
  KILN_STATUS_OK(cuda::moe_gate_up_swiglu_bf16(dx.get(), n, top_k, hidden, inter, dgu.get(), experts, d, INFINITY,
                                               dh.get(), nullptr, s));
  KILN_STATUS_OK(cuda::moe_down_bf16(dh.get(), pairs, inter, hidden, ddown.get(), experts, d, drw.get(), dy.get(),
                                     nullptr, s));
  KILN_STATUS_OK(cuda::moe_combine_bf16(dy.get(), n, top_k, hidden, add ? dadd.get() : nullptr, dout.get(), nullptr,
                                        folded ? shared.y : nullptr));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  run.h = dh.download(), run.shared_h = dsh.download(), run.out = dout.download(), run.y = dy.download();
  // The grouping lists every pair exactly once.
  std::vector<int32_t> seen = order.download();
  std::sort(seen.begin(), seen.end());
  for (int64_t p = 0; p < pairs; ++p) ASSERT_EQ(seen[p], p);
}

// The decode path (group, gate_up + SwiGLU, down, combine; a folded shared expert in the same launches) vs the
// CPU; run twice, bit-identical (the per-warp partials are summed in a fixed order). Outputs are poisoned (NaN)
// first, so an element not written fails.
void run_expert_case(const ExpertCase& c, uint64_t seed) {
  const auto [experts, top_k, n, hidden, inter, hot, shared] = c;
  SCOPED_TRACE(::testing::Message() << "E " << experts << " top-" << top_k << " n " << n << " hidden " << hidden
                                    << " inter " << inter << " shared " << static_cast<int>(shared));
  const ExpertInputs in = make_inputs(c, seed);
  MoeReference ref = moe_reference(in.x.values, n, top_k, hidden, inter, in.gate_up.values, in.down.values, in.ids,
                                   in.route_w, in.add.values, INFINITY);
  MoeReference shared_ref;
  if (shared == Shared::kFolded) {
    shared_ref = dense_swiglu_reference(in.x.values, n, hidden, inter, in.shared_gate_up.values,
                                        in.shared_down.values, INFINITY);
    for (size_t i = 0; i < ref.out.size(); ++i) ref.out[i] += shared_ref.out[i];
  }

  ExpertRun first, again;
  run_expert_path(c, in, 0, n, first);
  EXPECT_LT(rel_error(widen(first.h), ref.h), 1e-2);
  EXPECT_LT(rel_error(widen(first.out), ref.out), 1e-2);
  for (float v : widen(first.out)) ASSERT_TRUE(std::isfinite(v)) << "an output element was not written";
  if (shared == Shared::kFolded) {
    EXPECT_LT(rel_error(widen(first.shared_h), shared_ref.h), 1e-2);
    const std::vector<float> shared_y(first.y.end() - n * hidden, first.y.end());
    EXPECT_LT(rel_error(shared_y, shared_ref.out), 1e-2);
  }
  run_expert_path(c, in, 0, n, again);
  EXPECT_EQ(again.h, first.h) << "h differs between two identical runs";
  EXPECT_EQ(again.out, first.out) << "output differs between two identical runs";

  // Batch invariance (the serving engine relies on it): the last token alone gives bit for bit what it got in
  // the batch, whatever the other rows of its experts (and of the shared expert).
  const int64_t t = n - 1;
  ExpertRun alone;
  run_expert_path(c, in, t, 1, alone);
  EXPECT_EQ(alone.h, std::vector<uint16_t>(first.h.begin() + t * top_k * inter, first.h.begin() + (t + 1) * top_k * inter))
      << "h of a token alone differs from the batch";
  EXPECT_EQ(alone.out, std::vector<uint16_t>(first.out.begin() + t * hidden, first.out.begin() + (t + 1) * hidden))
      << "output of a token alone differs from the batch";
  if (shared == Shared::kFolded)
    EXPECT_EQ(alone.shared_h, std::vector<uint16_t>(first.shared_h.begin() + t * inter, first.shared_h.end()))
        << "shared expert h of a token alone differs from the batch";
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

// The shared expert in the routed-expert launches (slot 0 of the grid, its rows the n tokens), and no shared
// expert at all: n = 1, 3, 16, 32 (one and two n8 tiles per pass), GLM-4.7-Flash's expert shape, odd sizes.
TEST(GpuMoeExperts, FoldedSharedExpertAndNoSharedMatchCpu) {
  const std::vector<ExpertCase> cases = {
      {8, 2, 1, 256, 96, -1, Shared::kFolded},    {16, 4, 3, 520, 200, -1, Shared::kFolded},
      {64, 4, 16, 520, 136, -1, Shared::kFolded}, {32, 4, 32, 264, 72, -1, Shared::kFolded},
      {4, 2, 3, 2048, 1536, -1, Shared::kFolded}, {8, 4, 5, 2056, 136, -1, Shared::kFolded},
      {8, 2, 1, 256, 96, -1, Shared::kNone},      {16, 4, 16, 2056, 40, -1, Shared::kNone},
      {64, 4, 32, 520, 136, -1, Shared::kNone},   {4, 4, 3, 64, 8, -1, Shared::kNone},
  };
  for (size_t i = 0; i < cases.size(); ++i) run_expert_case(cases[i], 90 + i);
}

TEST(GpuMoeExperts, ManyRowsOnOneExpertMatchCpu) {
  run_expert_case({64, 4, 64, 520, 136, 0}, 80);  // expert 0 has all 64 tokens (one full pass), the rest few
  run_expert_case({8, 1, 64, 264, 72, 3}, 81);    // all 64 tokens to expert 3 only; the other experts idle
  run_expert_case({8, 4, 70, 136, 40, 5}, 82);    // 70 rows: two passes over each weight tile
  run_expert_case({8, 4, 70, 136, 40, 5, Shared::kFolded}, 83);  // and two passes of the shared expert's 70 rows
}

// moe_combine_add_rmsnorm_bf16 is bit for bit moe_combine_bf16 followed by add_rmsnorm_bf16: residual and normed
// rows, with a folded shared expert's fp32 rows (rounded to bf16 first), a bf16 addend, both or neither; n = 1, 3,
// 16, 32, odd widths.
TEST(GpuMoeExperts, CombineAddRmsnormIsCombineThenAddRmsnorm) {
  std::mt19937_64 rng(71);
  const float eps = 1e-5f;
  for (auto [n, top_k, hidden] : {std::tuple{int64_t(1), int64_t(4), int64_t(2048)}, {3, 4, 2048}, {16, 2, 520},
                                  {32, 8, 136}, {3, 1, 7}, {5, 4, 300}}) {
    for (int mode = 0; mode < 4; ++mode) {
      const bool use_shared = mode & 1, use_add = mode & 2;
      SCOPED_TRACE(::testing::Message() << "n " << n << " top-" << top_k << " hidden " << hidden << " shared "
                                        << use_shared << " add " << use_add);
      const std::vector<float> y = random_f32(size_t(n) * top_k * hidden, rng, -2.f, 2.f);
      const std::vector<float> shared_y = random_f32(size_t(n) * hidden, rng, -2.f, 2.f);
      const std::vector<float> residual = random_f32(size_t(n) * hidden, rng, -8.f, 8.f);
      const Bf16Data add = random_bf16(size_t(n) * hidden, rng), weight = random_bf16(hidden, rng, 0.5f, 1.5f);
      DeviceBuffer<float> dy(y), dshared(shared_y), dres_a(residual), dres_b(residual);
      DeviceBuffer<uint16_t> dadd(add.bits), dw(weight.bits), dcombined(size_t(n) * hidden);
      DeviceBuffer<uint16_t> dnormed_a(size_t(n) * hidden), dnormed_b(size_t(n) * hidden);
      dnormed_a.poison();
      dnormed_b.poison();
      const float* sy = use_shared ? dshared.get() : nullptr;
      const uint16_t* ad = use_add ? dadd.get() : nullptr;
      KILN_STATUS_OK(cuda::moe_combine_bf16(dy.get(), n, top_k, hidden, ad, dcombined.get(), nullptr, sy));
      KILN_STATUS_OK(cuda::add_rmsnorm_bf16(dcombined.get(), dres_a.get(), dw.get(), n, hidden, eps, dnormed_a.get(),
                                            nullptr));
      KILN_STATUS_OK(cuda::moe_combine_add_rmsnorm_bf16(dy.get(), n, top_k, hidden, ad, sy, dres_b.get(), dw.get(),
                                                        eps, dnormed_b.get(), nullptr));
      const std::vector<float> res_a = dres_a.download(), res_b = dres_b.download();
      ASSERT_EQ(std::memcmp(res_a.data(), res_b.data(), res_a.size() * sizeof(float)), 0) << "residual differs";
      EXPECT_EQ(dnormed_b.download(), dnormed_a.download()) << "normed rows differ";
      // And the two-launch result is the combine it claims to be (the routed sum in slot order, then the adds).
      const std::vector<uint16_t> combined = dcombined.download();
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < hidden; i += 97) {
          float s = 0.f;
          for (int64_t j = 0; j < top_k; ++j) s += y[(t * top_k + j) * hidden + i];
          if (use_shared) s += cpu::bf16_to_float(cpu::float_to_bf16(shared_y[t * hidden + i]));
          if (use_add) s += add.values[t * hidden + i];
          ASSERT_EQ(combined[t * hidden + i], cpu::float_to_bf16(s)) << "token " << t << " element " << i;
        }
    }
  }
}

}  // namespace
}  // namespace kiln::test
