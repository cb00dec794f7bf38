#include "model/host_experts_bf16.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/half_float.h"
#include "model/mla_moe_model.h"

namespace kiln {

Status expert_mlp_bf16(const MlpWeights& w, const float* x, int64_t rows, float* y, float swiglu_limit) {
  const int64_t inter = w.gate->out_features();
  std::vector<float> g(rows * inter), u(rows * inter), a(rows * inter);
  KILN_RETURN_IF_ERROR(run_linear(*w.gate, x, rows, g.data()));
  KILN_RETURN_IF_ERROR(run_linear(*w.up, x, rows, u.data()));
  cpu::swiglu(g.data(), u.data(), rows, inter, inter, a.data(), swiglu_limit);
  cpu::round_to_bf16(a.data(), rows * inter);
  return run_linear(*w.down, a.data(), rows, y);
}

Status routed_expert_pairs_bf16(std::span<const MlpWeights> experts, int64_t expert_begin, int64_t num_experts,
                                const float* h, int64_t n, int64_t hidden, int64_t top_k, const int32_t* ids,
                                const float* route_weights, float* pair_out, float swiglu_limit) {
  const int64_t E = static_cast<int64_t>(experts.size());
  std::vector<std::vector<int64_t>> pairs(E);
  for (int64_t p = 0; p < n * top_k; ++p) {
    if (ids[p] < 0 || ids[p] >= num_experts)
      return out_of_range("expert id " + std::to_string(ids[p]) + " (token " + std::to_string(p / top_k) +
                          ") is outside [0, " + std::to_string(num_experts) + ")");
    const int64_t local = ids[p] - expert_begin;
    if (local >= 0 && local < E) pairs[local].push_back(p);
  }
  std::vector<float> x, y;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = static_cast<int64_t>(pairs[e].size());
    if (rows == 0) continue;
    x.resize(rows * hidden), y.resize(rows * hidden);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(h + (pairs[e][r] / top_k) * hidden, hidden, x.data() + r * hidden);
    KILN_RETURN_IF_ERROR(expert_mlp_bf16(experts[e], x.data(), rows, y.data(), swiglu_limit));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = pairs[e][r];
      for (int64_t i = 0; i < hidden; ++i) pair_out[p * hidden + i] = y[r * hidden + i] * route_weights[p];
    }
  }
  return ok_status();
}

Status routed_experts_bf16(std::span<const MlpWeights> experts, const float* h, int64_t n, int64_t hidden,
                           int64_t top_k, const int32_t* ids, const float* route_weights, float* out,
                           float swiglu_limit) {
  std::vector<float> pair_out(n * top_k * hidden, 0.0f);
  KILN_RETURN_IF_ERROR(routed_expert_pairs_bf16(experts, 0, static_cast<int64_t>(experts.size()), h, n, hidden, top_k,
                                                ids, route_weights, pair_out.data(), swiglu_limit));
  for (int64_t t = 0; t < n; ++t) {
    float* dst = out + t * hidden;
    std::fill(dst, dst + hidden, 0.0f);
    for (int64_t j = 0; j < top_k; ++j)
      for (int64_t i = 0; i < hidden; ++i) dst[i] += pair_out[(t * top_k + j) * hidden + i];
  }
  return ok_status();
}

}  // namespace kiln
