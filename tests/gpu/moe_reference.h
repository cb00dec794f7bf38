// CPU reference for the routed-expert GPU paths: per pair gate_up GEMM, SwiGLU, h rounded to bf16 (as the GPU
// stores it), down, then the route-weighted sum per token plus `add` (the shared expert).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half_float.h"

namespace kiln::test {

struct MoeReference {
  std::vector<float> h;    // [pairs, inter], pair order
  std::vector<float> out;  // [n, hidden]
};

// x [n, hidden], gate_up [E, 2·inter, hidden], down [E, hidden, inter], ids / route_w [n·top_k], add [n, hidden]
// or empty.
inline MoeReference moe_reference(const std::vector<float>& x, int64_t n, int64_t top_k, int64_t hidden,
                                  int64_t inter, const std::vector<float>& gate_up, const std::vector<float>& down,
                                  const std::vector<int32_t>& ids, const std::vector<float>& route_w,
                                  const std::vector<float>& add, float limit) {
  MoeReference r{std::vector<float>(size_t(n * top_k) * inter), std::vector<float>(size_t(n) * hidden, 0.f)};
  if (!add.empty()) r.out = add;
  std::vector<float> gu(2 * inter), h(inter), y(hidden);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t p = t * top_k + j, e = ids[p];
      cpu::gemm_f32(x.data() + t * hidden, 1, hidden, gate_up.data() + e * 2 * inter * hidden, 2 * inter, gu.data());
      cpu::swiglu(gu.data(), gu.data() + inter, 1, inter, 2 * inter, h.data(), limit);
      for (auto& v : h) v = cpu::bf16_to_float(cpu::float_to_bf16(v));
      std::copy(h.begin(), h.end(), r.h.begin() + p * inter);
      cpu::gemm_f32(h.data(), 1, inter, down.data() + e * hidden * inter, hidden, y.data());
      for (int64_t i = 0; i < hidden; ++i) r.out[t * hidden + i] += route_w[p] * y[i];
    }
  }
  return r;
}

// A dense SwiGLU MLP (a shared expert) on every row: the case E = 1, top_k = 1, weight 1.
inline MoeReference dense_swiglu_reference(const std::vector<float>& x, int64_t n, int64_t hidden, int64_t inter,
                                           const std::vector<float>& gate_up, const std::vector<float>& down,
                                           float limit) {
  return moe_reference(x, n, 1, hidden, inter, gate_up, down, std::vector<int32_t>(n, 0), std::vector<float>(n, 1.f),
                       {}, limit);
}

}  // namespace kiln::test
