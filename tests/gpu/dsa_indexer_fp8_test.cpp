// The DSA indexer's fp8 key rows on CUDA against the host reference: the append's bytes against
// encode_indexer_key_fp8 (known keys and random ones), and the paged scores over fp8 rows against
// cpu::dsa_indexer_scores_fp8 with the top-k they select.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "device_buffer.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cuda/topk.h"
#include "kiln/indexer_key_codec.h"
#include "runtime/cuda/indexer_key_fp8_kernels.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::test {
namespace {

// Keys the codec's edge cases come from (zero, float subnormals, and with `extremes` 1e30, ±448 and the ties around
// it), then random ones over several magnitudes.
std::vector<float> test_keys(int64_t n, int64_t dim, std::mt19937_64& rng, bool extremes) {
  std::vector<float> k(static_cast<size_t>(n * dim), 0.0f);
  auto key = [&](int64_t t) { return k.data() + t * dim; };
  key(1)[0] = 1e-40f, key(1)[dim - 1] = -1e-40f;                        // subnormal key: scale FLT_MIN
  if (extremes) {
    key(2)[1] = 1e30f, key(2)[2] = -1e30f, key(2)[3] = 5e29f;  // huge
    const float edge[] = {448.0f, -448.0f, 1.0625f, 1.1875f, 432.0f, -440.0f, 0.0009765625f, 0.0029296875f};
    for (int64_t i = 0; i < std::min<int64_t>(dim, 8); ++i) key(3)[i] = edge[i];  // scale exactly 1
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t t = extremes ? 4 : 2; t < n; ++t) {
    // 2^-5 .. 2^5 with extremes (the codes' whole range), 2^-2 .. 2^2 for scores (so no key dwarfs the rest).
    const float magnitude = extremes ? std::ldexp(1.0f, static_cast<int>(t % 11) - 5)
                                     : std::ldexp(1.0f, static_cast<int>(t % 5) - 2);
    for (int64_t i = 0; i < dim; ++i) key(t)[i] = magnitude * normal(rng);
  }
  return k;  // key 0 stays all zero
}

TEST(GpuIndexerKeysFp8, AppendWritesTheHostCodecsBytes) {
  std::mt19937_64 rng(7);
  for (int64_t dim : {128, 16, 132}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const int64_t n = 37, slots_total = 64, rb = dim + 4;
    const std::vector<float> k = test_keys(n, dim, rng, true);
    // Slots scattered (5 is odd: t → 5t + 3 mod 64 never repeats); key 5 is padding (slot −1: stores nothing).
    std::vector<int64_t> slots(n);
    for (int64_t t = 0; t < n; ++t) slots[t] = (5 * t + 3) % slots_total;
    slots[5] = -1;
    std::vector<uint8_t> want(static_cast<size_t>(slots_total * rb), 0xFF);
    for (int64_t t = 0; t < n; ++t)
      if (slots[t] >= 0) encode_indexer_key_fp8(k.data() + t * dim, dim, want.data() + slots[t] * rb);
    DeviceBuffer<float> dk(k);
    DeviceBuffer<int64_t> dslots(slots);
    DeviceBuffer<uint8_t> dcache(want.size());
    dcache.poison();
    KILN_STATUS_OK(cuda::indexer_keys_append_fp8(dk.get(), n, dim, dslots.get(), dcache.get(), nullptr));
    const std::vector<uint8_t> got = dcache.download();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << "byte " << i % rb << " of slot " << i / rb;
  }
}

// Two sequences (prefill rows of one, decode rows of the other) over reversed pages: every score within 1e-5 of the
// row's largest |score| of the host's (fp32 sums of the same products in another order), −inf exactly where the
// host has it, and the top 16 of each row the same set wherever the host's cut is not a near-tie.
TEST(GpuIndexerKeysFp8, PagedScoresAndSelectionMatchTheHost) {
  std::mt19937_64 rng(29);
  for (auto [heads, dim] : {std::pair<int64_t, int64_t>{32, 128}, {8, 16}, {64, 128}}) {
    SCOPED_TRACE("heads " + std::to_string(heads) + " dim " + std::to_string(dim));
    const int64_t bs = 16, rb = dim + 4, topk = 16;
    const std::vector<int64_t> lens = {300, 45};          // keys per sequence
    const std::vector<int64_t> queries = {6, 2};          // the last rows of each
    const int64_t max_blocks = (300 + bs - 1) / bs, total_blocks = 2 * max_blocks, width = 300;
    std::vector<int32_t> tables(2 * max_blocks);
    for (int64_t b = 0; b < 2 * max_blocks; ++b) tables[b] = static_cast<int32_t>(total_blocks - 1 - b);
    std::vector<uint8_t> cache(static_cast<size_t>(total_blocks * bs * rb), 0);
    std::vector<std::vector<uint8_t>> contiguous(2);
    for (int s = 0; s < 2; ++s) {
      const std::vector<float> k = test_keys(lens[s], dim, rng, false);
      contiguous[s].resize(static_cast<size_t>(lens[s] * rb));
      for (int64_t t = 0; t < lens[s]; ++t) {
        const int64_t slot = static_cast<int64_t>(tables[s * max_blocks + t / bs]) * bs + t % bs;
        encode_indexer_key_fp8(k.data() + t * dim, dim, cache.data() + slot * rb);
        std::copy_n(cache.data() + slot * rb, rb, contiguous[s].data() + t * rb);
      }
    }
    const int64_t rows = queries[0] + queries[1];
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(rows * heads * dim)), w(static_cast<size_t>(rows * heads));
    for (float& x : q) x = normal(rng);
    for (float& x : w) x = normal(rng);
    std::vector<int32_t> query_seq, kv_len;
    for (int s = 0; s < 2; ++s)
      for (int64_t i = 0; i < queries[s]; ++i)
        query_seq.push_back(s), kv_len.push_back(static_cast<int32_t>(lens[s] - queries[s] + i + 1));

    const float scale = 1.0f / std::sqrt(static_cast<float>(dim)), head_scale = 1.0f / std::sqrt(float(heads));
    std::vector<float> wh(w);
    for (float& x : wh) x *= head_scale;  // the host takes the weights with the head scale applied
    std::vector<float> want(static_cast<size_t>(rows * width), -INFINITY);
    for (int64_t r0 = 0, s = 0; s < 2; r0 += queries[s], ++s) {
      std::vector<float> part(static_cast<size_t>(queries[s] * lens[s]));
      cpu::dsa_indexer_scores_fp8(q.data() + r0 * heads * dim, contiguous[s].data(), wh.data() + r0 * heads,
                                  queries[s], lens[s], heads, dim, scale, part.data());
      for (int64_t i = 0; i < queries[s]; ++i) std::copy_n(part.data() + i * lens[s], lens[s], want.data() + (r0 + i) * width);
    }

    DeviceBuffer<float> dq(q), dw(w), dscores(want.size());
    DeviceBuffer<uint8_t> dcache(cache);
    DeviceBuffer<int32_t> dtables(tables), dqs(query_seq), dkv(kv_len), dsel(static_cast<size_t>(rows * topk));
    dscores.poison();
    cuda::DsaIndexerParams p;
    p.q = dq.get(), p.w = dw.get(), p.rows = rows, p.heads = heads, p.dim = dim, p.scale = scale,
    p.head_scale = head_scale;
    p.keys = dcache.get(), p.key_format = IndexerKeyFormat::kFp8E4m3Scaled, p.block_size = bs;
    p.block_tables = dtables.get(), p.max_blocks = max_blocks, p.query_seq = dqs.get(), p.kv_len = dkv.get();
    p.width = width, p.scores = dscores.get();
    KILN_STATUS_OK(cuda::dsa_indexer_scores_paged(p, nullptr));
    KILN_STATUS_OK(cuda::topk_rows(dscores.get(), rows, width, topk, -1, dsel.get(), nullptr));
    const std::vector<float> got = dscores.download();
    const std::vector<int32_t> sel = dsel.download();

    double worst = 0;
    int64_t compared = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* wr = want.data() + r * width;
      const float* gr = got.data() + r * width;
      double top = 0;
      for (int64_t t = 0; t < kv_len[r]; ++t) top = std::max(top, std::fabs(double(wr[t])));
      for (int64_t t = 0; t < width; ++t) {
        if (std::isinf(wr[t])) {
          ASSERT_TRUE(std::isinf(gr[t]) && gr[t] < 0) << "row " << r << " key " << t;
          continue;
        }
        ASSERT_TRUE(std::isfinite(gr[t])) << "row " << r << " key " << t;
        worst = std::max(worst, std::fabs(double(gr[t]) - wr[t]) / std::max(top, 1e-30));
      }
      // The host's top 16 (by value; the rows here have more visible keys than that) against the device's.
      std::vector<int32_t> order(static_cast<size_t>(kv_len[r]));
      for (int32_t t = 0; t < kv_len[r]; ++t) order[t] = t;
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return wr[a] > wr[b]; });
      const double gap = double(wr[order[topk - 1]]) - wr[order[topk]];
      if (gap < 1e-4 * top) continue;  // a near-tie at the cut: either key is a correct selection
      ++compared;
      std::vector<int32_t> host(order.begin(), order.begin() + topk), dev(sel.begin() + r * topk, sel.begin() + (r + 1) * topk);
      std::sort(host.begin(), host.end());
      std::sort(dev.begin(), dev.end());
      EXPECT_EQ(dev, host) << "row " << r;
    }
    std::printf("DSA indexer on fp8 keys (heads %lld, dim %lld): GPU vs host scores, worst |Δ| of a row's largest "
                "%.3g; top-%lld sets compared on %lld of %lld rows\n", static_cast<long long>(heads),
                static_cast<long long>(dim), worst, static_cast<long long>(topk), static_cast<long long>(compared),
                static_cast<long long>(rows));
    EXPECT_LE(worst, 1e-5);
    EXPECT_GE(compared, rows - 1);
  }
}

}  // namespace
}  // namespace kiln::test
