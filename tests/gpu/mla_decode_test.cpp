// Paged absorbed MLA decode against cpu::mla_attention_absorbed_bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "device_buffer.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/mla_decode_sm90.h"
#include "kiln/cuda/mla_decode_sync.h"

namespace kiln::test {
namespace {

// q and the softmax weights enter the tensor cores as bf16: rel ‖Δ‖/‖ref‖ < 1e-2.
constexpr double kTolerance = 1e-2;

struct Case {
  int64_t heads;
  int64_t block_size;
  std::vector<int32_t> kv_lens;  // per sequence: its last row's kv_len
  int num_splits;
  int64_t selected_width;  // 0: dense
  // Query rows per sequence (empty: one each), consecutive; row i of r sees kv_len − (r − 1 − i) keys, as the
  // 1 + K rows of a speculative verification do.
  std::vector<int32_t> rows = {};
  bool grouped = false;  // pass row_groups from mla_decode_row_groups
  bool split_by_length = false;  // num_splits is then taken from mla_decode_length_splits(longest row)
  bool bf16_only = false;        // out = null: only the bf16 output is written (checked against the reference)
  int64_t rope = 64;             // 0: rows of the latent alone (NoPE DSA)
  bool nan_padding = false;      // every cache row no query may see holds NaN (stale or never-written slots)
};

// Runs one case through one kernel against the CPU reference. The bf16 output, written alongside, must be the fp32
// output rounded to nearest even, bit for bit; with split_by_length, row 0 run alone (with the split count the
// runner would give it) must give the same bits as beside the other rows (batch invariance). The Hopper kernel is
// skipped where it does not take the parameters (a DSA selection; another GPU).
void run_case_with(const Case& c, uint64_t seed, cuda::MlaDecodeKernel kernel) {
  std::mt19937_64 rng(seed);
  const int64_t kRow = 512 + c.rope;
  const int64_t num_seqs = static_cast<int64_t>(c.kv_lens.size());
  std::vector<int32_t> query_seq, row_len;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t r = c.rows.empty() ? 1 : c.rows[s];
    for (int32_t i = 0; i < r; ++i) {
      query_seq.push_back(static_cast<int32_t>(s));
      row_len.push_back(c.kv_lens[s] - (r - 1 - i));
    }
  }
  const int64_t nq = static_cast<int64_t>(query_seq.size());
  const int64_t max_len = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
  const int64_t max_blocks = (max_len + c.block_size - 1) / c.block_size;
  const int64_t pages = num_seqs * max_blocks + 3;
  // Pages handed out in a shuffled order so the block tables matter.
  std::vector<int32_t> page_ids(pages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  std::vector<int32_t> tables(num_seqs * max_blocks, -1);
  for (int64_t s = 0, next = 0; s < num_seqs; ++s)
    for (int64_t b = 0; b * c.block_size < c.kv_lens[s]; ++b) tables[s * max_blocks + b] = page_ids[next++];
  Bf16Data cache = random_bf16(size_t(pages * c.block_size) * kRow, rng, -2.f, 2.f);
  if (c.nan_padding) {
    std::vector<bool> seen(size_t(pages * c.block_size), false);
    for (int64_t s = 0; s < num_seqs; ++s)
      for (int64_t pos = 0; pos < c.kv_lens[s]; ++pos)
        seen[size_t(tables[s * max_blocks + pos / c.block_size]) * c.block_size + pos % c.block_size] = true;
    for (size_t slot = 0; slot < seen.size(); ++slot)
      if (!seen[slot]) std::fill_n(cache.bits.begin() + slot * kRow, kRow, uint16_t{0x7fc0});
  }
  const Bf16Data q = random_bf16(size_t(nq * c.heads) * kRow, rng, -1.f, 1.f);  // bf16-exact q
  std::vector<int32_t> selected;
  if (c.selected_width > 0) {
    selected.assign(nq * c.selected_width, -1);
    for (int64_t s = 0; s < nq; ++s) {
      std::vector<int32_t> pos(row_len[s]);
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      const int64_t k = std::min<int64_t>(c.selected_width, row_len[s]);
      std::copy(pos.begin(), pos.begin() + k, selected.begin() + s * c.selected_width);
    }
  }
  const float scale = 1.0f / 16.0f;

  std::vector<float> want(size_t(nq * c.heads) * 512);
  std::vector<double> want_lse(size_t(nq * c.heads), -INFINITY);  // ln Σ e^{scale · q·k}, in double
  for (int64_t s = 0; s < nq; ++s) {
    std::vector<int64_t> slots;
    const int64_t seq = query_seq[s];
    auto slot_of = [&](int64_t p) { return int64_t(tables[seq * max_blocks + p / c.block_size]) * c.block_size + p % c.block_size; };
    if (c.selected_width > 0) {
      for (int64_t j = 0; j < c.selected_width; ++j)
        if (int32_t p = selected[s * c.selected_width + j]; p >= 0) slots.push_back(slot_of(p));
    } else {
      for (int64_t p = 0; p < row_len[s]; ++p) slots.push_back(slot_of(p));
    }
    for (int64_t h = 0; h < c.heads && !slots.empty(); ++h) {
      std::vector<double> scores;
      for (int64_t slot : slots) {
        double dot = 0;
        for (int64_t i = 0; i < kRow; ++i)
          dot += double(q.values[(s * c.heads + h) * kRow + i]) * cpu::bf16_to_float(cache.bits[slot * kRow + i]);
        scores.push_back(dot * scale);
      }
      const double m = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (double v : scores) sum += std::exp(v - m);
      want_lse[s * c.heads + h] = m + std::log(sum);
    }
    std::vector<float> scratch(c.heads * slots.size() + kRow);
    cpu::mla_attention_absorbed_bf16(q.values.data() + s * c.heads * kRow, c.heads, 512, c.rope, cache.bits.data(),
                                     slots.data(), slots.size(), scale, want.data() + s * c.heads * 512,
                                     scratch.data());
  }

  DeviceBuffer<float> dq(q.values), dout(want.size());
  DeviceBuffer<uint16_t> dout_bf(want.size());
  dout_bf.poison();
  DeviceBuffer<float> dlse(want_lse.size());
  dlse.poison();
  DeviceBuffer<uint16_t> dcache(cache.bits);
  DeviceBuffer<int32_t> dtables(tables), dseq(query_seq), dlen(row_len), dsel(selected.empty() ? std::vector<int32_t>{0} : selected);
  // Room for the split count row 0 alone gets below (up to 15 more, as the runner rounds it).
  DeviceBuffer<unsigned char> workspace(std::max<size_t>(1, cuda::mla_decode_workspace_bytes(nq, c.heads, c.num_splits + 15)));
  workspace.poison();
  dout.poison();
  cuda::MlaDecodeParams p;
  p.q = dq.get();
  p.rope_dim = c.rope;
  p.num_queries = nq;
  p.num_heads = c.heads;
  p.cache = dcache.get();
  p.block_size = c.block_size;
  p.block_tables = dtables.get();
  p.max_blocks = max_blocks;
  p.query_seq = dseq.get();
  p.kv_len = dlen.get();
  p.selected = c.selected_width > 0 ? dsel.get() : nullptr;
  p.selected_width = c.selected_width;
  p.scale = scale;
  p.out = c.bf16_only ? nullptr : dout.get();
  p.out_bf16 = dout_bf.get();
  p.out_lse = dlse.get();
  p.num_splits = c.num_splits;
  p.split_by_length = c.split_by_length;
  p.workspace = workspace.get();
  const std::vector<int32_t> groups = cuda::mla_decode_row_groups(query_seq.data(), nq);
  DeviceBuffer<int32_t> dgroups(groups);
  if (c.grouped) {
    p.row_groups = dgroups.get();
    p.num_groups = static_cast<int64_t>(groups.size()) - 1;
    for (size_t i = 0; i + 1 < groups.size(); ++i)
      p.max_group_rows = std::max<int64_t>(p.max_group_rows, groups[i + 1] - groups[i]);
  }
  if (kernel == cuda::MlaDecodeKernel::sm90 && !cuda::mla_decode_sm90_takes(p)) return;
  EXPECT_TRUE(cuda::mla_decode_bf16(p, nullptr, kernel).ok());
  KILN_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got_bf = dout_bf.download();
  std::vector<float> got(got_bf.size());
  if (c.bf16_only) {
    for (size_t i = 0; i < got.size(); ++i) got[i] = cpu::bf16_to_float(got_bf[i]);
  } else {
    got = dout.download();
    size_t mismatched = 0;
    for (size_t i = 0; i < got.size(); ++i) mismatched += cpu::float_to_bf16(got[i]) != got_bf[i];
    EXPECT_EQ(mismatched, 0u) << "the bf16 output is not the fp32 output rounded";
  }
  for (float v : got) {
    EXPECT_TRUE(std::isfinite(v)) << "an output element was not written";
    if (!std::isfinite(v)) break;
  }
 // Each pair's log-sum-exp (what decode-context parallelism merges ranks with): its scores are fp32 sums of exact
  // bf16 products, so it stays within 1e-3 of the double reference; −inf exactly where no key is visible.
  const std::vector<float> got_lse = dlse.download();
  size_t lse_off = 0;
  for (size_t i = 0; i < got_lse.size(); ++i)
    lse_off += std::isinf(want_lse[i]) ? !(std::isinf(got_lse[i]) && got_lse[i] < 0)
                                       : !(std::fabs(got_lse[i] - want_lse[i]) <= 1e-3 * std::max(1.0, std::fabs(want_lse[i])));
  EXPECT_EQ(lse_off, 0u) << "log-sum-exp off the reference (e.g. pair 0: " << got_lse[0] << " vs " << want_lse[0] << ")";
  EXPECT_LT(rel_error(got, want), kTolerance) << "heads " << c.heads << " block " << c.block_size << " splits "
                                              << c.num_splits << " sel " << c.selected_width << " rows "
                                              << nq << (c.grouped ? " grouped" : "") << (c.bf16_only ? " bf16" : "")
                                              << (kernel == cuda::MlaDecodeKernel::sm90 ? " sm90" : " mma.sync");
  if (c.num_splits >= cuda::kMlaKernelMergeMinSplits) {
    // With merge counters (and a grid that fits on the device at once) the decode kernel merges its splits itself:
    // the same bits as the separate merge, and the counters back at zero after every launch (two rounds).
    cuda::MlaDecodeSync sync(0);
    ASSERT_NE(sync.get(), nullptr);
    cuda::MlaDecodeParams m = p;
    m.sync = sync.get();
    DeviceBuffer<float> mout(want.size());
    DeviceBuffer<uint16_t> mout_bf(want.size());
    DeviceBuffer<float> mlse(want_lse.size());
    m.out = c.bf16_only ? nullptr : mout.get();
    m.out_bf16 = mout_bf.get();
    m.out_lse = mlse.get();
    for (int round = 0; round < 2; ++round) {
      mout_bf.poison();
      mout.poison();
      mlse.poison();
      EXPECT_TRUE(cuda::mla_decode_bf16(m, nullptr, kernel).ok());
      KILN_CUDA_OK(cudaDeviceSynchronize());
      EXPECT_TRUE(mout_bf.download() == got_bf) << "kernel-side merge, round " << round;
      const std::vector<float> ml = mlse.download();
      EXPECT_EQ(0, std::memcmp(ml.data(), got_lse.data(), ml.size() * sizeof(float))) << "kernel-side merge lse";
      if (!c.bf16_only) {
        const std::vector<float> mf = mout.download();
        EXPECT_EQ(0, std::memcmp(mf.data(), got.data(), got.size() * sizeof(float))) << "kernel-side merge, round " << round;
      }
      std::vector<unsigned> counters(2 * cuda::kMlaSyncGroups, 1u);
      KILN_CUDA_OK(cudaMemcpy(counters.data(), sync.get(), cuda::mla_decode_sync_bytes(), cudaMemcpyDeviceToHost));
      EXPECT_TRUE(std::all_of(counters.begin(), counters.end(), [](unsigned v) { return v == 0u; }))
          << "merge counters left non-zero";
    }
  }
  if (c.split_by_length && !c.grouped) {
    const size_t n = size_t(c.heads) * 512;
    DeviceBuffer<float> alone(n);
    DeviceBuffer<uint16_t> alone_bf(n);
    cuda::MlaDecodeParams a = p;
    a.num_queries = 1;
    a.num_splits = (cuda::mla_decode_length_splits(row_len[0]) + 15) / 16 * 16;
    a.out = c.bf16_only ? nullptr : alone.get();
    a.out_bf16 = alone_bf.get();
    a.out_lse = nullptr;
    ASSERT_LE(cuda::mla_decode_workspace_bytes(1, c.heads, a.num_splits), workspace.size());
    EXPECT_TRUE(cuda::mla_decode_bf16(a, nullptr, kernel).ok());
    const std::vector<uint16_t> one_bf = alone_bf.download();
    EXPECT_TRUE(std::equal(one_bf.begin(), one_bf.end(), got_bf.begin())) << "row 0 changed with the rows beside it";
    if (!c.bf16_only) {
      const std::vector<float> one = alone.download();
      EXPECT_EQ(0, std::memcmp(one.data(), got.data(), n * sizeof(float))) << "row 0 changed with the rows beside it";
    }
  }
}

// Both kernels: the SDK's mma.sync kernel everywhere, the Hopper one (TMA + wgmma) on an sm_90 GPU.
void run_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(seed);
  run_case_with(c, seed, cuda::MlaDecodeKernel::mma_sync);
  run_case_with(c, seed, cuda::MlaDecodeKernel::sm90);
}

bool on_sm90() {
  int major = 0, minor = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess && major == 9 && minor == 0;
}

// What the Hopper kernel takes: dense rows of 512 + 64 or 512 + 0 on pages of 8, 16, 32 or a multiple of 64 tokens.
TEST(GpuMlaDecode, HopperKernelTakesDenseRowsOnAnSm90) {
  alignas(16) uint16_t pages[8] = {};  // the kernel's copies need a 16-byte aligned cache
  cuda::MlaDecodeParams p;
  p.cache = pages;
  p.block_size = 64;
  EXPECT_EQ(cuda::mla_decode_sm90_takes(p), on_sm90());
  p.rope_dim = 0;
  EXPECT_EQ(cuda::mla_decode_sm90_takes(p), on_sm90());
  for (int64_t bs : {8, 16, 32, 128, 192}) {
    p.block_size = bs;
    EXPECT_EQ(cuda::mla_decode_sm90_takes(p), on_sm90()) << bs;
  }
  for (int64_t bs : {4, 24, 48, 100}) {
    p.block_size = bs;
    EXPECT_FALSE(cuda::mla_decode_sm90_takes(p)) << bs;
  }
  p.block_size = 64;
  const int32_t sel = 0;
  p.selected = &sel;
  EXPECT_FALSE(cuda::mla_decode_sm90_takes(p));
}

// Slots no query may see (the tail of a sequence's last page, pages no table names) hold NaN: a kernel that copies
// whole pages must keep them out (a zero softmax weight times NaN is NaN). Page sizes 8 and 128, 1 and 128 heads.
TEST(GpuMlaDecode, UnseenSlotsNeverReachTheOutput) {
  for (auto [heads, bs, lens, splits, seed] :
       {std::tuple{20, 64, std::vector<int32_t>{1, 63, 65, 130}, 1, 41}, {1, 8, {77, 9}, 3, 42}, {128, 128, {200, 129}, 2, 43},
        {20, 128, {5000}, 64, 44}, {32, 16, {1000, 31}, 5, 45}}) {
    Case c{heads, bs, lens, splits, 0};
    c.nan_padding = true;
    run_case(c, seed);
  }
}

// Decode-context parallelism hands a rank rows that see none of its tokens (kv_len 0: the first positions live on
// other ranks, and prefilling rows are left to the prefill kernel): output 0 and log-sum-exp −inf, with one split,
// with splits merged in a second launch or in the grid, and split by length.
TEST(GpuMlaDecode, RowsWithoutKeysGiveZerosAndMinusInfinity) {
  run_case({20, 64, {0, 300}, 1, 0}, 51);
  run_case({20, 64, {0, 300, 0}, 4, 0}, 52);
  run_case({20, 64, {0, 9000}, 64, 0}, 53);
  Case c{20, 64, {0, 4096, 0}, cuda::mla_decode_length_splits(4096), 0};
  c.split_by_length = true;
  run_case(c, 54);
}

TEST(GpuMlaDecode, OneSplitMatchesCpu) {
  run_case({20, 64, {1, 37, 64, 300}, 1, 0}, 1);
  run_case({16, 16, {5, 129}, 1, 0}, 2);
  run_case({7, 64, {200}, 1, 0}, 3);
}

TEST(GpuMlaDecode, SplitKvMatchesCpu) {
  run_case({20, 64, {4099}, 16, 0}, 4);
  run_case({64, 64, {1000, 3, 2500}, 7, 0}, 5);
  run_case({128, 32, {777}, 4, 0}, 6);
  run_case({20, 64, {100}, 8, 0}, 7);  // more splits than tiles: empty splits must not disturb the merge
}

// Enough splits for the kernel-side merge (kMlaKernelMergeMinSplits): run_case checks it against the separate merge
// bit for bit, with rows of several lengths, empty splits, 64 heads (two CTA columns) and NoPE rows.
TEST(GpuMlaDecode, KernelSideMergeMatchesTheSeparateMerge) {
  static_assert(cuda::kMlaKernelMergeMinSplits <= 128);
  run_case({20, 64, {9000, 131, 4100}, 128, 0}, 31);
  run_case({64, 64, {7000, 2}, cuda::kMlaKernelMergeMinSplits, 0}, 32);
  run_case({20, 64, {300}, 100, 0}, 33);  // 5 tiles over 100 splits: most splits empty
  run_case({20, 64, {8000, 9000}, 64, 0, {3, 2}, true}, 34);
  run_case({16, 64, {9000}, 64, 0, {}, false, false, true, 0}, 35);
}

TEST(GpuMlaDecode, SelectedTokensMatchCpu) {
  run_case({20, 64, {3000, 50}, 1, 2048}, 8);
  run_case({64, 64, {5000}, 5, 2048}, 9);
}

// GLM-5.3-Flash's NoPE DSA rows: the 512-wide latent alone, 64 heads, through a 2063-wide selection (top 2048 +
// the tail pool) and densely, one split and split-KV, batch-invariant splitting.
TEST(GpuMlaDecode, NoPeRowsMatchCpu) {
  run_case({64, 64, {3000, 50}, 1, 2063, {}, false, false, false, 0}, 21);
  run_case({64, 64, {5000}, 5, 2063, {}, false, false, false, 0}, 22);
  run_case({64, 16, {1, 37, 300}, 1, 0, {}, false, false, false, 0}, 23);
  run_case({20, 64, {4099}, 16, 0, {}, false, false, false, 0}, 24);
  run_case({64, 64, {2063, 2100}, cuda::mla_decode_length_splits(2063), 2063, {}, false, true, false, 0}, 25);
  run_case({64, 64, {700}, 3, 2063, {3}, false, false, true, 0}, 26);
}

TEST(GpuMlaDecode, GroupedRowsMatchCpu) {
  // Sequences of 1..6 rows, one split and split-KV (with more splits than some groups have tiles).
  run_case({20, 64, {300, 1000, 77, 64, 5000, 129}, 1, 0, {1, 2, 3, 4, 5, 6}, true}, 10);
  run_case({20, 64, {300, 1000, 77, 64, 5000, 129}, 8, 0, {6, 1, 5, 2, 4, 3}, true}, 11);
  run_case({20, 64, {4099, 50}, 16, 0, {6, 1}, true}, 12);
  run_case({64, 64, {700, 900}, 3, 0, {3, 2}, true}, 13);   // 192 pairs: 4 CTAs of 48
  run_case({16, 16, {33, 12}, 1, 0, {10, 2}, true}, 14);    // 10 rows: groups of 8 and 2
  run_case({7, 64, {200, 5}, 2, 0, {5, 3}, true}, 15);      // 35 pairs in one CTA
  run_case({20, 64, {300, 77}, 4, 0, {3, 2}, false}, 16);   // the same rows without groups: one CTA column each
}

TEST(GpuMlaDecode, RowGroupsFollowSequences) {
  const std::vector<int32_t> seq = {0, 0, 1, 1, 1, 2};
  EXPECT_EQ(cuda::mla_decode_row_groups(seq.data(), 6), (std::vector<int32_t>{0, 2, 5, 6}));
  const std::vector<int32_t> one(10, 4);
  EXPECT_EQ(cuda::mla_decode_row_groups(one.data(), 10), (std::vector<int32_t>{0, 8, 10}));
  EXPECT_EQ(cuda::mla_decode_row_groups(nullptr, 0), (std::vector<int32_t>{0}));
  EXPECT_EQ(cuda::mla_decode_grouped_num_splits(1, 6, 20, 32768, 132), 33);  // 4 CTAs of 30 pairs per group of 6 rows
  EXPECT_EQ(cuda::mla_decode_grouped_num_splits(4, 1, 20, 32768, 132), 33);  // one row per group: as ungrouped
}

// Splits sized by each row's own length (the batch-invariant steps): rows of very different lengths in one launch,
// the longest needing the whole split dimension and the shortest a single split.
TEST(GpuMlaDecode, SplitByLengthMatchesCpu) {
  for (auto [lens, seed] : {std::pair{std::vector<int32_t>{9000, 70, 1}, 8}, {{131, 4096}, 9}, {{20000}, 10}}) {
    const int splits = cuda::mla_decode_length_splits(*std::max_element(lens.begin(), lens.end()));
    Case c{20, 64, lens, splits, 0};
    c.split_by_length = true;
    run_case(c, seed);
  }
  EXPECT_EQ(cuda::mla_decode_length_splits(4096), 32);     // two tiles a split
  EXPECT_EQ(cuda::mla_decode_length_splits(131072), 128);  // 16 tiles a split
  EXPECT_EQ(cuda::mla_decode_length_splits(100), 1);
}

// Only the bf16 output (the runner's o_lat_bf): written by the kernel itself (one split) or by the combine.
TEST(GpuMlaDecode, Bf16OnlyOutputMatchesCpu) {
  Case direct{20, 64, {1, 300, 4099}, 1, 0};
  direct.bf16_only = true;
  run_case(direct, 17);
  Case split{20, 64, {9000, 70, 1}, cuda::mla_decode_length_splits(9000), 0};
  split.split_by_length = true;
  split.bf16_only = true;
  run_case(split, 18);
}

TEST(GpuMlaDecode, SplitHeuristicFillsTheChip) {
  EXPECT_EQ(cuda::mla_decode_num_splits(1, 20, 131072, 132), 132);
  EXPECT_EQ(cuda::mla_decode_num_splits(1, 20, 100, 132), 1);
  EXPECT_EQ(cuda::mla_decode_num_splits(64, 20, 4096, 132), 3);
}

}  // namespace
}  // namespace kiln::test
