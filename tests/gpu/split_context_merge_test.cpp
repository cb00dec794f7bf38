// Decode-context parallelism's attention on CUDA, one process standing in for the ranks: a sequence's positions dealt
// round-robin to W "ranks" (position p to rank p mod W as its local token p div W, in pages of its own), each rank
// attends every head over its own tokens with the log-sum-exp (the tensor-core kernel at 512 + 64, the plain kernel
// the fixtures' narrow widths take), and merge_attention_parts_bf16 combines them — against the same kernel over
// the whole sequence on one rank and against the CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "device_buffer.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cuda/mla_decode.h"
#include "runtime/cuda/model_glue_kernels.h"
#include "runtime/cuda/split_context_merge.h"

namespace kiln::test {
namespace {

struct Shape {
  int64_t latent, rope, heads, block_size;
  int world;
  std::vector<int32_t> kv_len;  // one query row per entry, each its own sequence
  int64_t head_begin, head_count;  // the heads this "rank" keeps
};

// Attention of rows (q [rows, heads, latent + rope]) over pages through a block table per row; out fp32 + lse.
void attend(const Shape& s, const DeviceBuffer<float>& q, const DeviceBuffer<uint16_t>& cache,
            const std::vector<int32_t>& tables, int64_t max_blocks, const std::vector<int32_t>& kv_len,
            std::vector<float>& out, std::vector<float>& lse) {
  const int64_t rows = static_cast<int64_t>(kv_len.size()), L = s.latent;
  std::vector<int32_t> seq(rows);
  std::iota(seq.begin(), seq.end(), 0);
  DeviceBuffer<int32_t> dt(tables), ds(seq), dl(kv_len);
  DeviceBuffer<float> dout(rows * s.heads * L), dlse(rows * s.heads);
  dout.poison(), dlse.poison();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(kv_len.begin(), kv_len.end()));
  if (L == 512) {
    cuda::MlaDecodeParams p;
    p.rope_dim = s.rope, p.q = q.get(), p.num_queries = rows, p.num_heads = s.heads, p.cache = cache.get();
    p.block_size = s.block_size, p.block_tables = dt.get(), p.max_blocks = max_blocks, p.query_seq = ds.get();
    p.kv_len = dl.get(), p.scale = 0.0625f, p.out = dout.get(), p.out_lse = dlse.get();
    p.num_splits = cuda::mla_decode_length_splits(longest), p.split_by_length = true;
    DeviceBuffer<unsigned char> ws(std::max<size_t>(1, cuda::mla_decode_workspace_bytes(rows, s.heads, p.num_splits)));
    p.workspace = ws.get();
    ASSERT_TRUE(cuda::mla_decode_bf16(p, nullptr).ok());
    KILN_CUDA_OK(cudaDeviceSynchronize());
  } else {
    int64_t w = 16;  // score rows rounded up to a power of two, as the bf16 layout plans them
    while (w < longest) w *= 2;
    DeviceBuffer<float> scores(rows * s.heads * w);
    cuda::MlaReferenceParams p;
    p.q = q.get(), p.rows = rows, p.heads = s.heads, p.latent_dim = L, p.rope_dim = s.rope, p.cache = cache.get();
    p.block_size = s.block_size, p.block_tables = dt.get(), p.max_blocks = max_blocks, p.query_seq = ds.get();
    p.kv_len = dl.get(), p.max_kv_len = w, p.scale = 0.0625f, p.scores = scores.get(), p.out = dout.get();
    p.lse = dlse.get();
    ASSERT_TRUE(cuda::mla_attention_reference(p, nullptr).ok());
    KILN_CUDA_OK(cudaDeviceSynchronize());
  }
  out = dout.download(), lse = dlse.download();
}

void run(const Shape& s, uint64_t seed) {
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int64_t row = s.latent + s.rope, rows = static_cast<int64_t>(s.kv_len.size()), L = s.latent;
  const int W = s.world;
  const int64_t longest = *std::max_element(s.kv_len.begin(), s.kv_len.end());
  const Bf16Data q = random_bf16(size_t(rows * s.heads * row), rng, -1.f, 1.f);
  DeviceBuffer<float> dq(q.values);
  // Every row's tokens, position-major: token (r, p) is row r's position p.
  const Bf16Data tokens = random_bf16(size_t(rows * longest * row), rng, -2.f, 2.f);

  // One rank: each row's positions in pages 0.. of its own (shuffled page order does not matter for this claim).
  const int64_t max_blocks = (longest + s.block_size - 1) / s.block_size;
  auto pages_of = [&](int rank, int ranks) {
    // Rank `rank` of `ranks`: row r's local token k (position k·ranks + rank) at page r·max_blocks + k / bs.
    std::vector<uint16_t> cache(size_t(rows * max_blocks * s.block_size * row), 0);
    std::vector<int32_t> tables(rows * max_blocks), local(rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < max_blocks; ++b) tables[r * max_blocks + b] = static_cast<int32_t>(r * max_blocks + b);
      int64_t k = 0;
      for (int64_t p = rank; p < s.kv_len[r]; p += ranks, ++k)
        std::copy_n(tokens.bits.begin() + (r * longest + p) * row, row,
                    cache.begin() + ((r * max_blocks + k / s.block_size) * s.block_size + k % s.block_size) * row);
      local[r] = static_cast<int32_t>(k);
    }
    return std::tuple{cache, tables, local};
  };
  auto [whole, whole_tables, whole_len] = pages_of(0, 1);
  std::vector<float> one, one_lse;
  {
    DeviceBuffer<uint16_t> dc(whole);
    attend(s, dq, dc, whole_tables, max_blocks, whole_len, one, one_lse);
  }
  std::vector<float> parts, lses;
  for (int rank = 0; rank < W; ++rank) {
    auto [cache, tables, local] = pages_of(rank, W);
    DeviceBuffer<uint16_t> dc(cache);
    std::vector<float> part, lse;
    attend(s, dq, dc, tables, max_blocks, local, part, lse);
    parts.insert(parts.end(), part.begin(), part.end());
    lses.insert(lses.end(), lse.begin(), lse.end());
  }
  DeviceBuffer<float> dparts(parts), dlses(lses);
  DeviceBuffer<uint16_t> merged(rows * s.head_count * L);
  merged.poison();
  ASSERT_TRUE(cuda::merge_attention_parts_bf16(dparts.get(), dlses.get(), W, rows, s.heads, L, s.head_begin,
                                               s.head_count, merged.get(), nullptr)
                  .ok());
  const std::vector<uint16_t> got_bits = merged.download();

  // The CPU reference over the whole row, and one rank's output, for the kept heads.
  std::vector<float> got(got_bits.size()), want(got_bits.size()), single(got_bits.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> slots(s.kv_len[r]);
    std::iota(slots.begin(), slots.end(), r * longest);
    std::vector<float> out(s.heads * L), scratch(s.heads * slots.size() + row);
    cpu::mla_attention_absorbed_bf16(q.values.data() + r * s.heads * row, s.heads, L, s.rope, tokens.bits.data(),
                                     slots.data(), static_cast<int64_t>(slots.size()), 0.0625f, out.data(),
                                     scratch.data());
    for (int64_t h = 0; h < s.head_count; ++h)
      for (int64_t d = 0; d < L; ++d) {
        const size_t i = size_t((r * s.head_count + h) * L + d);
        got[i] = cpu::bf16_to_float(got_bits[i]);
        want[i] = out[(s.head_begin + h) * L + d];
        single[i] = one[size_t((r * s.heads + s.head_begin + h) * L + d)];
      }
  }
  for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "a merged element was not written";
  // bf16 tensor-core operands (512 + 64) and the bf16 result: 1e-2 relative, as the decode kernel's own tests.
  EXPECT_LT(rel_error(got, want), 1e-2) << "merged vs CPU, world " << W << " latent " << L;
  EXPECT_LT(rel_error(got, single), 1e-2) << "merged vs one rank, world " << W << " latent " << L;
  // A row with no key at all (kv_len 0) stays 0.
  for (int64_t r = 0; r < rows; ++r)
    if (s.kv_len[r] == 0)
      for (int64_t i = 0; i < s.head_count * L; ++i) EXPECT_EQ(got[r * s.head_count * L + i], 0.0f);
}

TEST(GpuSplitContext, MergedRanksMatchOneRankTensorCore) {
  // Row lengths below, at and past the ranks (some ranks see no key of a row), and long enough for split KV.
  run({512, 64, 20, 64, 2, {1, 2, 3, 130, 4097}, 0, 10}, 1);
  run({512, 64, 20, 64, 2, {1, 700}, 10, 10}, 2);
  run({512, 64, 16, 16, 3, {0, 1, 2, 5, 999}, 0, 16}, 3);
  run({512, 0, 8, 64, 4, {3, 300}, 2, 5}, 4);
}

TEST(GpuSplitContext, MergedRanksMatchOneRankPlainKernel) {
  run({32, 8, 4, 16, 2, {1, 2, 17, 40}, 0, 2}, 5);
  run({128, 16, 8, 16, 2, {3, 102}, 4, 4}, 6);
  run({64, 0, 3, 8, 3, {0, 5, 77}, 0, 3}, 7);
}

}  // namespace
}  // namespace kiln::test
