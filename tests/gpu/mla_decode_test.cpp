// Paged absorbed MLA decode against cpu::mla_attention_absorbed_bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "device_buffer.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cuda/mla_decode.h"

namespace kiln::test {
namespace {

constexpr int64_t kRow = 576;
// q and the softmax weights enter the tensor cores as bf16: rel ‖Δ‖/‖ref‖ < 1e-2.
constexpr double kTolerance = 1e-2;

struct Case {
  int64_t heads;
  int64_t block_size;
  std::vector<int32_t> kv_lens;  // one query row per sequence
  int num_splits;
  int64_t selected_width;  // 0: dense
};

void run_case(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t nq = static_cast<int64_t>(c.kv_lens.size());
  const int64_t max_len = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
  const int64_t max_blocks = (max_len + c.block_size - 1) / c.block_size;
  const int64_t pages = nq * max_blocks + 3;
  // Pages handed out in a shuffled order so the block tables matter.
  std::vector<int32_t> page_ids(pages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  std::vector<int32_t> tables(nq * max_blocks, -1);
  for (int64_t s = 0, next = 0; s < nq; ++s)
    for (int64_t b = 0; b * c.block_size < c.kv_lens[s]; ++b) tables[s * max_blocks + b] = page_ids[next++];
  const Bf16Data cache = random_bf16(size_t(pages * c.block_size) * kRow, rng, -2.f, 2.f);
  const Bf16Data q = random_bf16(size_t(nq * c.heads) * kRow, rng, -1.f, 1.f);  // bf16-exact q
  std::vector<int32_t> query_seq(nq);
  std::iota(query_seq.begin(), query_seq.end(), 0);
  std::vector<int32_t> selected;
  if (c.selected_width > 0) {
    selected.assign(nq * c.selected_width, -1);
    for (int64_t s = 0; s < nq; ++s) {
      std::vector<int32_t> pos(c.kv_lens[s]);
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      const int64_t k = std::min<int64_t>(c.selected_width, c.kv_lens[s]);
      std::copy(pos.begin(), pos.begin() + k, selected.begin() + s * c.selected_width);
    }
  }
  const float scale = 1.0f / 16.0f;

  std::vector<float> want(size_t(nq * c.heads) * 512);
  for (int64_t s = 0; s < nq; ++s) {
    std::vector<int64_t> slots;
    auto slot_of = [&](int64_t p) { return int64_t(tables[s * max_blocks + p / c.block_size]) * c.block_size + p % c.block_size; };
    if (c.selected_width > 0) {
      for (int64_t j = 0; j < c.selected_width; ++j)
        if (int32_t p = selected[s * c.selected_width + j]; p >= 0) slots.push_back(slot_of(p));
    } else {
      for (int64_t p = 0; p < c.kv_lens[s]; ++p) slots.push_back(slot_of(p));
    }
    std::vector<float> scratch(c.heads * slots.size() + kRow);
    cpu::mla_attention_absorbed_bf16(q.values.data() + s * c.heads * kRow, c.heads, 512, 64, cache.bits.data(),
                                     slots.data(), slots.size(), scale, want.data() + s * c.heads * 512,
                                     scratch.data());
  }

  DeviceBuffer<float> dq(q.values), dout(want.size());
  DeviceBuffer<uint16_t> dcache(cache.bits);
  DeviceBuffer<int32_t> dtables(tables), dseq(query_seq), dlen(c.kv_lens), dsel(selected.empty() ? std::vector<int32_t>{0} : selected);
  DeviceBuffer<unsigned char> workspace(std::max<size_t>(1, cuda::mla_decode_workspace_bytes(nq, c.heads, c.num_splits)));
  workspace.poison();
  dout.poison();
  cuda::MlaDecodeParams p;
  p.q = dq.get();
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
  p.out = dout.get();
  p.num_splits = c.num_splits;
  p.workspace = workspace.get();
  KILN_STATUS_OK(cuda::mla_decode_bf16(p, nullptr));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(rel_error(dout.download(), want), kTolerance)
      << "heads " << c.heads << " block " << c.block_size << " splits " << c.num_splits << " sel " << c.selected_width;
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

TEST(GpuMlaDecode, SelectedTokensMatchCpu) {
  run_case({20, 64, {3000, 50}, 1, 2048}, 8);
  run_case({64, 64, {5000}, 5, 2048}, 9);
}

TEST(GpuMlaDecode, SplitHeuristicFillsTheChip) {
  EXPECT_EQ(cuda::mla_decode_num_splits(1, 20, 131072, 132), 132);
  EXPECT_EQ(cuda::mla_decode_num_splits(1, 20, 100, 132), 1);
  EXPECT_EQ(cuda::mla_decode_num_splits(64, 20, 4096, 132), 3);
}

}  // namespace
}  // namespace kiln::test
