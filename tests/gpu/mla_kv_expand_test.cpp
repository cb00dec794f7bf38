// The Hopper kv_b expansion (kernels/cuda/mla_kv_expand_sm90.h) against a double-precision CPU product, and the two
// properties it exists for: a value's bits do not depend on how many heads the launch covers (a tensor-parallel
// rank's heads) nor on how many keys it covers or where a key sits among them (chunked prefill re-expands cached
// keys). Skipped off Hopper. (mla_prefill_attention runs it only with KILN_MLA_KV_EXPAND=sm90: see its header.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "device_buffer.h"
#include "kv_expansion_reference.h"
#include "kernels/cuda/mla_kv_expand_sm90.h"

namespace kiln::test {
namespace {

using ExpandCase = KvExpansionShape;

// Runs the expansion of keys [k0, k0 + keys) and heads [h0, h0 + hs) of the case's operands; returns bf16
// [hs][keys][head_width], or an empty vector when the kernel does not apply.
std::vector<uint16_t> expand(const ExpandCase& c, const Bf16Data& latent, const Bf16Data& kv_b, int64_t k0,
                             int64_t keys, int64_t h0, int64_t hs) {
  const std::vector<uint16_t> lat(latent.bits.begin() + k0 * c.row_width,
                                  latent.bits.begin() + (k0 + keys) * c.row_width);
  const std::vector<uint16_t> w(kv_b.bits.begin() + h0 * c.head_width * c.latent,
                                kv_b.bits.begin() + (h0 + hs) * c.head_width * c.latent);
  DeviceBuffer<uint16_t> dlat(lat), dw(w), dout(size_t(hs * keys * c.head_width));
  dout.poison();
  if (!cuda::mla_kv_expand_sm90_supported(c.latent, c.row_width, c.head_width, dlat.get(), dw.get(), dout.get()))
    return {};
  const Status st = cuda::mla_kv_expand_sm90(dlat.get(), keys, c.row_width, c.latent, dw.get(), hs, c.head_width,
                                             dout.get(), nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return dout.download();
}

void run_case(const ExpandCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Bf16Data latent = random_bf16(size_t(c.keys * c.row_width), rng);
  const Bf16Data kv_b = random_bf16(size_t(c.heads * c.head_width * c.latent), rng, -0.1f, 0.1f);
  const std::vector<uint16_t> whole = expand(c, latent, kv_b, 0, c.keys, 0, c.heads);
  if (whole.empty()) GTEST_SKIP() << "mla_kv_expand_sm90 needs a compute capability 9.0 device";

  expect_exact_kv_expansion(c, latent, kv_b, whole);

  // A rank's heads: the same bits as in the one-rank launch.
  for (int parts : {2, 3}) {
    if (parts > c.heads) continue;
    for (int r = 0; r < parts; ++r) {
      const int64_t h0 = c.heads * r / parts, hs = c.heads * (r + 1) / parts - h0;
      const std::vector<uint16_t> part = expand(c, latent, kv_b, 0, c.keys, h0, hs);
      int64_t differ = 0;
      for (int64_t h = 0; h < hs; ++h)
        for (int64_t i = 0; i < c.keys * c.head_width; ++i)
          differ += part[h * c.keys * c.head_width + i] != whole[(h0 + h) * c.keys * c.head_width + i];
      EXPECT_EQ(differ, 0) << "heads " << h0 << ".." << h0 + hs << " of " << parts << " ranks";
    }
  }
  // Fewer keys, and keys starting elsewhere (other rows of the launch's key blocks): the same bits.
  for (const auto& [k0, n] : {std::pair<int64_t, int64_t>{0, 1}, {0, c.keys / 2 + 1}, {c.keys / 3, c.keys - c.keys / 3},
                              {c.keys - 1, 1}}) {
    const std::vector<uint16_t> part = expand(c, latent, kv_b, k0, n, 0, c.heads);
    int64_t differ = 0;
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < n * c.head_width; ++i)
        differ += part[h * n * c.head_width + i] != whole[(h * c.keys + k0) * c.head_width + i];
    EXPECT_EQ(differ, 0) << "keys " << k0 << ".." << k0 + n << " of " << c.keys;
  }
}

TEST(GpuMlaKvExpand, GlmShapesMatchTheExactProductAndKeepBits) {
  run_case({20, 448, 512, 576, 300}, 1);  // GLM-4.7-Flash: nope 192 + v 256, latent 512 + rope 64; a key tail
}

TEST(GpuMlaKvExpand, OtherShapesMatchTheExactProductAndKeepBits) {
  run_case({8, 256, 512, 576, 700}, 2);   // DeepSeek-V3's head shapes, fewer heads
  run_case({8, 64, 128, 144, 257}, 3);    // models/tiny-glm
  run_case({4, 32, 32, 40, 130}, 4);      // the tiny fixtures: one k tile, part of it past the latent
  run_case({3, 6, 72, 80, 65}, 5);        // a k tail of 8, 18 kv_b rows (a column block mostly past the end)
  run_case({5, 130, 200, 264, 129}, 6);   // heads straddling column blocks at odd offsets
}

}  // namespace
}  // namespace kiln::test
