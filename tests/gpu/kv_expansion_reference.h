// The MLA kv_b expansion's reference check, shared by the tests of its two one-launch forms (mla_kv_expand_test,
// head_batched_gemm_test): out[h][key][j] (bf16, head-major) against the exact product latent[key][:L] · kv_b[h·W + j]
// in double. A value is the fp32 sum rounded to bf16, so it lies within half a bf16 step of the exact value (2^-8
// relative) plus the fp32 sum's own error (bounded loosely by 2e-5 · Σ|terms|: fp32 accumulation over up to 512
// terms). Prints the worst error as a fraction of its bound; EXPECTs no value beyond it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "device_buffer.h"

namespace kiln::test {

struct KvExpansionShape {
  int64_t heads, head_width, latent, row_width, keys;
};

// Checks every key_step-th key (long cases: the CPU's double sums dominate the test's time).
inline void expect_exact_kv_expansion(const KvExpansionShape& c, const Bf16Data& latent, const Bf16Data& kv_b,
                                      const std::vector<uint16_t>& out, int64_t key_step = 1) {
  int64_t bad = 0;
  double worst = 0;
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t k = 0; k < c.keys; k += key_step)
      for (int64_t j = 0; j < c.head_width; ++j) {
        double exact = 0, magnitude = 0;
        const float* x = latent.values.data() + k * c.row_width;
        const float* w = kv_b.values.data() + (h * c.head_width + j) * c.latent;
        for (int64_t l = 0; l < c.latent; ++l) exact += double(x[l]) * w[l], magnitude += std::fabs(double(x[l]) * w[l]);
        const double got = cpu::bf16_to_float(out[(h * c.keys + k) * c.head_width + j]);
        const double err = std::fabs(got - exact), bound = std::ldexp(std::fabs(exact), -8) + 2e-5 * magnitude;
        worst = std::max(worst, err / (bound > 0 ? bound : 1));
        bad += !(err <= bound);
      }
  std::printf("  H=%lld width=%lld L=%lld row=%lld keys=%lld: worst error %.3g of its bound\n", (long long)c.heads,
              (long long)c.head_width, (long long)c.latent, (long long)c.row_width, (long long)c.keys, worst);
  EXPECT_EQ(bad, 0) << bad << " values beyond half a bf16 step of the exact product";
}

}  // namespace kiln::test
