// The direct form of fp8_ds_mla's tensor-core attention (fp8_mla_direct_attend.cu) against the host's fp32
// attention and against the widened form, where its own machinery can go wrong (the score and value warps' two
// buffers and their hand-offs wrap around only in splits of three or more tiles: the fixed 8-split and one-split
// runs): pages of 8 / 16 / 32 / 64 / 128
// slots (one to eight bulk copies a tile, or a piece of a larger page), contexts of 1 .. 8,200 keys (a partial last
// tile whose stale slots hold 0xff bytes — NaN in e4m3 and in the scales — which must never reach the output), 1 / 5 /
// 20 / 32 / 64 / 128 heads (one to four n8 tiles, several CTAs a row), rope 64 and NoPE, splits by length, a fixed
// split count and no split; and rows whose scales span 2^−14 .. 2^26 under scores that do not depend on them (the
// running per-tile unit that keeps the fp16 weights ≤ 1). Bounds: 1e-2 of a head's largest |out| against the host;
// the log-sum-exp within 1e-3 of the widened form's; a row's bits alone equal to its bits among the others.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fp8_gpu_test_support.h"
#include "fp8_mla_kernels.h"
#include "fp8_mla_row.h"
#include "kiln/cuda/mla_decode_plan.h"

namespace kiln::fp8mla {
namespace {

struct DirectShape {
  int64_t rope, heads, block;
  bool wide_scales;  // rows at 2^−14 .. 2^26 with q's latent part zero (scores from the rope part alone)
};

class Fp8MlaDirectAttention : public ::testing::TestWithParam<DirectShape> {};

TEST_P(Fp8MlaDirectAttention, MatchesTheHostAndTheWidenedForm) {
  load_plugins();
  const DirectShape sh = GetParam();
  const int64_t latent = 512, W = latent + sh.rope, heads = sh.heads, block = sh.block;
  auto cpu = make_layout(Device::cpu(), latent, sh.rope, block);
  ASSERT_TRUE(cpu);
  const RowGeometry geom{latent, sh.rope};
  RowShape shape;
  shape.latent = latent, shape.rope = sh.rope, shape.tiles = geom.tiles();
  shape.scales_offset = geom.scales_offset(), shape.rope_offset = geom.rope_offset(), shape.row_bytes = geom.bytes();
  if (!direct_attend_takes(shape, block, 0, reinterpret_cast<const void*>(uintptr_t{256})))
    GTEST_SKIP() << "the direct form needs an sm_90+ device with 222 KB of shared memory a block";

  // 8,200 keys: 80 splits by length, enough for the merge inside the grid when a row runs alone.
  const std::vector<int32_t> kv_len = {1, 63, 64, 65, 700, 4097, 8200};
  const int64_t nq = static_cast<int64_t>(kv_len.size()), keys = 8200;
  const int64_t blocks = (keys + block - 1) / block + 3;  // spare pages stay 0xff
  std::mt19937 rng(static_cast<uint32_t>(sh.rope * 131 + heads * 7 + block));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(keys * W);
  for (int64_t t = 0; t < keys; ++t) {
    const int kind = static_cast<int>(t % 97);
    const float spread = kind == 11   ? 0.0f
                         : kind == 29 ? 1e-30f
                         : sh.wide_scales ? std::ldexp(1.0f, static_cast<int>(t % 41) - 14)
                                          : std::ldexp(1.0f, static_cast<int>(t % 9) - 4);
    for (int64_t i = 0; i < latent; ++i) rows[t * W + i] = spread * normal(rng);
    for (int64_t i = latent; i < W; ++i) rows[t * W + i] = normal(rng);
  }
  auto [table, pages] = store_on_shuffled_pages(*cpu, rows, keys, blocks, block, 0xff, rng);

  std::vector<float> q(nq * heads * W);
  for (int64_t i = 0; i < nq * heads; ++i)
    for (int64_t d = 0; d < W; ++d) {
      const bool lat = d < latent;
      q[i * W + d] = lat && sh.wide_scales ? 0.0f : (lat ? 0.05f : 0.3f) * normal(rng);
    }
  const std::vector<int32_t> query_seq(nq, 0);
  std::vector<float> want(nq * heads * latent);
  MlaAttendArgs m;
  m.num_queries = nq, m.num_heads = heads, m.max_blocks = blocks, m.scale = 0.07f, m.max_kv_len = keys;
  m.cache = pages.data(), m.q = q.data(), m.block_tables = table.data(), m.query_seq = query_seq.data();
  m.kv_len = kv_len.data(), m.out = want.data();
  ASSERT_TRUE(cpu->attend(m, {}).ok());

  Dev<uint8_t> d_pages(pages);
  Dev<float> d_q(q);
  Dev<int32_t> d_table(table), d_qs(query_seq), d_kv(kv_len);
  AttendParams p;
  p.shape = shape;
  p.pages = d_pages.p, p.block_size = block, p.q = d_q.p, p.num_queries = nq, p.num_heads = heads;
  p.block_tables = d_table.p, p.max_blocks = blocks, p.query_seq = d_qs.p, p.kv_len = d_kv.p, p.scale = 0.07f;
  ASSERT_TRUE(direct_attend_takes(shape, block, 0, d_pages.p));
  const int length_splits = static_cast<int>((cuda::mla_decode_length_splits(keys) + 15) / 16 * 16);
  Dev<char> workspace(cuda::mla_decode_workspace_bytes(nq, heads, length_splits));
  Dev<unsigned> sync(cuda::mla_decode_sync_bytes() / sizeof(unsigned));
  ASSERT_EQ(cudaMemset(sync.p, 0, cuda::mla_decode_sync_bytes()), cudaSuccess);
  struct Run {
    std::vector<float> out, lse;
  };
  auto run = [&](TcForm form, int splits, bool by_length, int64_t first, int64_t count, bool merge_in_grid) {
    Dev<float> out(static_cast<size_t>(count * heads * latent)), lse(static_cast<size_t>(count * heads));
    AttendParams r = p;
    r.q = d_q.p + first * heads * W, r.num_queries = count, r.query_seq = d_qs.p + first, r.kv_len = d_kv.p + first;
    r.out = out.p, r.out_lse = lse.p, r.sync = merge_in_grid ? sync.p : nullptr;
    const char* why = launch_tc_attend(r, splits, by_length, splits > 1 ? workspace.p : nullptr, nullptr, form);
    EXPECT_EQ(why, nullptr) << why;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return Run{out.get(), lse.get()};
  };
  auto worst_of = [&](const std::vector<float>& got) {
    double worst = 0;
    for (int64_t rh = 0; rh < nq * heads; ++rh) {
      double diff = 0, scale = 0;
      for (int64_t i = rh * latent; i < (rh + 1) * latent; ++i)
        diff = std::max(diff, std::fabs(double(got[i]) - want[i])), scale = std::max(scale, std::fabs(double(want[i])));
      worst = std::max(worst, scale > 0 ? diff / scale : diff);
    }
    return worst;
  };

  const Run direct = run(TcForm::kDirect, length_splits, true, 0, nq, true);
  const Run widened = run(TcForm::kWidened, length_splits, true, 0, nq, true);
  for (float x : direct.out) ASSERT_TRUE(std::isfinite(x)) << "a stale slot reached the output";
  const double worst_direct = worst_of(direct.out), worst_widened = worst_of(widened.out);
  std::printf("fp8_ds_mla 512 + %lld, %lld heads, pages of %lld%s: worst max |Δ| of a head's largest |out| vs the "
              "host: direct %.3g, widened %.3g\n", static_cast<long long>(sh.rope), static_cast<long long>(heads),
              static_cast<long long>(block), sh.wide_scales ? ", scales 2^-14 .. 2^26" : "", worst_direct,
              worst_widened);
  EXPECT_LE(worst_direct, 1e-2);
  for (int64_t i = 0; i < nq * heads; ++i)
    EXPECT_NEAR(direct.lse[i], widened.lse[i], 1e-3 * std::max(1.0f, std::fabs(widened.lse[i]))) << "pair " << i;

  // A row alone (its 80 splits merged inside the grid where the grid fits on the device at once) gives the same bits
  // as among the others (merged in a second launch: the grid is too large to be resident).
  const Run last_alone = run(TcForm::kDirect, length_splits, true, nq - 1, 1, true);
  EXPECT_TRUE(std::equal(last_alone.out.begin(), last_alone.out.end(), direct.out.end() - heads * latent))
      << "the longest row alone differs from the same row among the others";
  // Other cuts of the keys: 8 equal splits, and none (no workspace).
  EXPECT_LE(worst_of(run(TcForm::kDirect, 8, false, 0, nq, false).out), 1e-2) << "8 equal splits";
  EXPECT_LE(worst_of(run(TcForm::kDirect, 1, false, 0, nq, false).out), 1e-2) << "one split";
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8MlaDirectAttention,
                         ::testing::Values(DirectShape{64, 20, 64, false}, DirectShape{64, 20, 64, true},
                                           DirectShape{0, 20, 64, false}, DirectShape{64, 1, 128, false},
                                           DirectShape{64, 32, 16, false}, DirectShape{64, 64, 8, false},
                                           DirectShape{0, 5, 32, true}, DirectShape{64, 128, 64, false}),
                         [](const auto& info) {
                           return "rope" + std::to_string(info.param.rope) + "_heads" +
                                  std::to_string(info.param.heads) + "_pages" + std::to_string(info.param.block) +
                                  (info.param.wide_scales ? "_wide_scales" : "");
                         });

// The switch: KILN_FP8MLA_ATTEND=widened is read once per process, so here only that kDirect refuses what it cannot
// take (a DSA selection) and names why, while kAuto falls back.
TEST(Fp8MlaDirectAttentionForm, RefusesASelectionAndNamesWhy) {
  RowShape shape;
  shape.latent = 512, shape.rope = 0, shape.tiles = 4, shape.scales_offset = 512, shape.rope_offset = 528;
  shape.row_bytes = 528;
  EXPECT_FALSE(direct_attend_takes(shape, 64, 2048, reinterpret_cast<const void*>(uintptr_t{256})));
  EXPECT_FALSE(direct_attend_takes(shape, 48, 0, reinterpret_cast<const void*>(uintptr_t{256})));
  EXPECT_FALSE(direct_attend_takes(shape, 64, 0, reinterpret_cast<const void*>(uintptr_t{258})));
  AttendParams p;
  p.shape = shape;
  int32_t dummy = 0;
  alignas(16) float qbuf[4] = {};
  p.pages = reinterpret_cast<const uint8_t*>(uintptr_t{256}), p.block_size = 64, p.q = qbuf, p.num_queries = 1;
  p.num_heads = 1, p.block_tables = &dummy, p.query_seq = &dummy, p.kv_len = &dummy, p.selected = &dummy;
  p.selected_width = 8;
  float out = 0;
  p.out = &out;
  const char* why = launch_tc_attend(p, 1, false, nullptr, nullptr, TcForm::kDirect);
  ASSERT_NE(why, nullptr);
  EXPECT_NE(std::string(why).find("direct form needs"), std::string::npos) << why;
}

}  // namespace
}  // namespace kiln::fp8mla
