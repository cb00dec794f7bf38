// The host-side planning of the SDK's tensor-core MLA decode (kiln/cuda/mla_decode_plan.h), which KV layouts call
// from plain C++: how a row's keys are cut into splits (batch invariance rests on it), the row groups of
// verification batches, the workspace, and the parameter check's messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/cuda/mla_decode_plan.h"

namespace kiln::cuda {
namespace {

// The kernel's split of a row of `keys` keys under split_by_length: split s covers tiles [s·t, min(tiles, (s+1)·t)).
std::vector<std::pair<int64_t, int64_t>> length_split_ranges(int64_t keys) {
  const int64_t tiles = (keys + kMlaDecodeTile - 1) / kMlaDecodeTile;
  const int64_t per = mla_decode_tiles_per_split(tiles);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int s = 0; s < mla_decode_length_splits(keys); ++s)
    out.emplace_back(s * per, std::min(tiles, (s + 1) * per));
  return out;
}

TEST(MlaDecodePlan, LengthSplitsCoverEveryTileOnceAndDependOnTheRowAlone) {
  for (int64_t keys : {1, 63, 64, 65, 128, 129, 4096, 4097, 16384, 16385, 131072, 1048576}) {
    const auto ranges = length_split_ranges(keys);
    const int64_t tiles = (keys + kMlaDecodeTile - 1) / kMlaDecodeTile;
    int64_t next = 0;
    for (const auto& [begin, end] : ranges) {
      EXPECT_EQ(begin, next) << keys << " keys";
      EXPECT_LT(begin, end) << keys << " keys: an empty split inside the grid the row needs";
      next = end;
    }
    EXPECT_EQ(next, tiles) << keys << " keys";
    // At least two tiles a split (one measured slower), and never more than kMlaLengthSplits splits.
    EXPECT_GE(mla_decode_tiles_per_split(tiles), 2);
    EXPECT_LE(static_cast<int64_t>(ranges.size()), kMlaLengthSplits);
  }
  // A row's cut is a function of its own length: the same whatever grid (longest row) it shares.
  EXPECT_EQ(length_split_ranges(1000), length_split_ranges(1000));
  EXPECT_EQ(mla_decode_length_splits(131072), 128);
  EXPECT_EQ(mla_decode_length_splits(4096), 32);
}

TEST(MlaDecodePlan, RowGroupsAreRunsOfOneSequenceCutAtTheCap) {
  const std::vector<int32_t> seq = {0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3};
  const std::vector<int32_t> groups = mla_decode_row_groups(seq.data(), static_cast<int64_t>(seq.size()));
  const std::vector<int32_t> want = {0, 3, 4, 4 + static_cast<int32_t>(kMlaMaxGroupRows), 14, 15};
  EXPECT_EQ(groups, want);
  EXPECT_TRUE(mla_decode_row_groups(seq.data(), 0).size() == 1);
}

TEST(MlaDecodePlan, SplitsFillAboutOneWaveAndWorkspaceHoldsEveryPartial) {
  // One row of 20 heads (one CTA) at 128K on 132 SMs: one split per SM; at 100 keys, as many as two-tile splits allow.
  EXPECT_EQ(mla_decode_num_splits(1, 20, 131072, 132), 132);
  EXPECT_EQ(mla_decode_num_splits(1, 20, 100, 132), 1);
  EXPECT_EQ(mla_decode_num_splits(1, 20, 129, 132), 2);
  // 128 heads: four CTAs a row.
  EXPECT_EQ(mla_decode_num_splits(1, 128, 131072, 132), 33);
  EXPECT_EQ(mla_decode_workspace_bytes(3, 20, 1), 0u);
  EXPECT_EQ(mla_decode_workspace_bytes(3, 20, 4), sizeof(float) * 4 * 3 * 20 * (kMlaLatentDim + 1));
}

TEST(MlaDecodePlan, CheckNamesWhatCannotRun) {
  alignas(16) static float q[64];
  uint16_t out[8];
  MlaDecodeParams p;
  p.q = q, p.num_queries = 1, p.num_heads = 4, p.block_size = 64, p.out_bf16 = out;
  EXPECT_EQ(mla_decode_check(p), nullptr);
  MlaDecodeParams bad = p;
  bad.rope_dim = 32;
  EXPECT_STREQ(mla_decode_check(bad), "rows are 512 latent values plus 64 or 0 rope values");
  bad = p;
  bad.num_splits = 2;
  EXPECT_STREQ(mla_decode_check(bad), "num_splits > 1 needs mla_decode_workspace_bytes of workspace");
  bad = p;
  bad.q = q + 1;
  EXPECT_STREQ(mla_decode_check(bad), "q must be 16-byte aligned (it is read as float4)");
  bad = p;
  bad.out_bf16 = nullptr;
  EXPECT_STREQ(mla_decode_check(bad), "need out or out_bf16");
  bad = p;
  const int32_t groups[2] = {0, 1};
  bad.row_groups = groups, bad.num_groups = 1;
  const int32_t sel[1] = {0};
  bad.selected = sel, bad.selected_width = 1;
  EXPECT_STREQ(mla_decode_check(bad), "row_groups needs dense attention, num_groups ≥ 1 and max_group_rows ≥ 1");
}

}  // namespace
}  // namespace kiln::cuda
