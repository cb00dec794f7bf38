#include "model/host_token_select.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "kernels/cpu/topk.h"

namespace kiln {
namespace {

cpu::SamplingParams params_of(const TokenSelection& s) {
  cpu::SamplingParams p;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  return p;
}

bool greedy(const TokenSelection& s) { return s.temperature <= 0.0f || s.top_k == 1; }

double q_of(const TokenSelection& s, int64_t draft, int32_t x) {
  if (!s.q_ids) return 1.0;  // greedy drafts: q is one-hot at the draft
  for (int64_t j = 0; j < s.q_width; ++j)
    if (s.q_ids[draft * s.q_width + j] == x) return s.q_probs[draft * s.q_width + j];
  return 0.0;
}

}  // namespace

int32_t draw_from_distribution(const float* probs, int64_t vocab, double u) {
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += probs[i];
  const double target = u * total;
  double running = 0.0;
  int32_t last_nonzero = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs[i] <= 0.0f) continue;
    running += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (running > target) return last_nonzero;
  }
  return last_nonzero;
}

Status select_tokens_host(const float* logits, int64_t vocab, std::span<const int64_t> first_row,
                          std::span<const TokenSelection> select, StepOutput& out) {
  out.tokens.assign(select.size(), {});
  out.accepted.assign(select.size(), 0);
  std::vector<float> p(vocab), residual(vocab);
  for (size_t i = 0; i < select.size(); ++i) {
    const TokenSelection& s = select[i];
    if (!s.select) continue;
    if (i >= first_row.size()) return internal_error("token selection for a step without logits");
    const int64_t K = s.num_drafts;
    if (static_cast<int64_t>(s.uniforms.size()) < (greedy(s) ? 0 : K + 1))
      return invalid_argument("token selection of entry " + std::to_string(i) + " needs " + std::to_string(K + 1) +
                              " uniforms");
    const float* rows = logits + first_row[i] * vocab;
    std::vector<int32_t>& tokens = out.tokens[i];
    // Drafts are the step's tokens 1..K; the caller put them in the selection's order: row j verifies draft j.
    if (greedy(s)) {
      for (int64_t j = 0; j <= K; ++j) {
        const int32_t target = cpu::argmax(rows + j * vocab, vocab);
        tokens.push_back(target);
        if (j == K || s.drafts[j] != target) break;
        ++out.accepted[i];
      }
      continue;
    }
    const cpu::SamplingParams params = params_of(s);
    bool rejected = false;
    for (int64_t j = 0; j < K && !rejected; ++j) {
      cpu::sampling_distribution(rows + j * vocab, vocab, params, p.data());
      const int32_t x = s.drafts[j];
      const double qx = q_of(s, j, x);
      // u < p/q without dividing: q(x) = 0 accepts iff p(x) > 0.
      if (s.uniforms[j] * qx < static_cast<double>(p[x])) {
        tokens.push_back(x);
        ++out.accepted[i];
        continue;
      }
      double mass = 0;
      for (int64_t t = 0; t < vocab; ++t) residual[t] = p[t];
      if (s.q_ids) {
        for (int64_t c = 0; c < s.q_width; ++c) {
          const int32_t id = s.q_ids[j * s.q_width + c];
          if (id >= 0 && id < vocab) residual[id] = std::max(p[id] - s.q_probs[j * s.q_width + c], 0.0f);
        }
      } else {
        residual[x] = std::max(p[x] - 1.0f, 0.0f);
      }
      for (int64_t t = 0; t < vocab; ++t) mass += residual[t];
      // A rejection implies p(x) < q(x), hence positive residual mass; rounding can still leave none.
      tokens.push_back(draw_from_distribution(mass > 0 ? residual.data() : p.data(), vocab, s.uniforms[K]));
      rejected = true;
    }
    if (rejected) continue;
    cpu::sampling_distribution(rows + K * vocab, vocab, params, p.data());
    tokens.push_back(draw_from_distribution(p.data(), vocab, s.uniforms[K]));
  }
  return ok_status();
}

Status sample_drafts_host(const DraftSampleRequest& r, int64_t vocab) {
  if (r.rows > 0 && (!r.logits || !r.tokens || !r.temperatures || !r.uniforms))
    return invalid_argument("draft sampling needs logits, tokens, temperatures and uniforms");
  if (r.q_width < 1 || r.q_width > 256) return invalid_argument("draft sampling: q_width must be in 1..256");
  const int64_t stride = r.q_row_stride > 0 ? r.q_row_stride : r.q_width;
  std::vector<int32_t> cand(r.q_width);
  std::vector<double> w(r.q_width);
  for (int64_t row = 0; row < r.rows; ++row) {
    const float* l = r.logits + row * vocab;
    int32_t* ids = r.q_ids ? r.q_ids + row * stride : nullptr;
    float* probs = r.q_probs ? r.q_probs + row * stride : nullptr;
    const float t = r.temperatures[row];
    if (t <= 0.0f) {
      r.tokens[row] = cpu::argmax(l, vocab);
      if (ids) std::fill(ids, ids + r.q_width, -1);
      continue;
    }
    const int64_t C = std::min<int64_t>(r.q_width, vocab);
    cpu::topk_indices(l, vocab, C, cand.data());
    const double inv_t = 1.0 / t, top = static_cast<double>(l[cand[0]]) * inv_t;
    double total = 0;
    for (int64_t c = 0; c < C; ++c) total += w[c] = std::exp(static_cast<double>(l[cand[c]]) * inv_t - top);
    // The draw runs over the candidates in index order.
    std::vector<int64_t> order(C);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cand[a] < cand[b]; });
    const double target = r.uniforms[row] * total;
    double running = 0;
    int32_t pick = cand[order[C - 1]];
    for (int64_t o : order) {
      running += w[o];
      if (running > target) {
        pick = cand[o];
        break;
      }
    }
    r.tokens[row] = pick;
    if (ids)
      for (int64_t c = 0; c < r.q_width; ++c) {
        ids[c] = c < C ? cand[c] : -1;
        probs[c] = c < C ? static_cast<float>(w[c] / total) : 0.0f;
      }
  }
  return ok_status();
}

}  // namespace kiln
