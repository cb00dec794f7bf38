#include "kernels/cpu/token_select.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "kernels/cpu/topk.h"

namespace kiln::cpu {
namespace {

bool greedy(const SelectParams& p) {
  return p.temperature <= 0.0f || p.top_k == 1;
}

bool valid_uniform(double u) {
  return u >= 0.0 && u < 1.0;
}

Status check_q_row(const SelectArgs& a, int64_t q_row, std::vector<char>& seen) {
  const int32_t* ids = a.q_ids + q_row * a.q_width;
  const float* probs = a.q_probs + q_row * a.q_width;
  Status status;
  for (int64_t c = 0; c < a.q_width && status.ok(); ++c) {
    if (ids[c] == -1) continue;
    if (ids[c] < 0 || ids[c] >= a.vocab)
      status = invalid_argument("q id " + std::to_string(ids[c]) + " out of [0, vocab)");
    else if (seen[ids[c]])
      status = invalid_argument("q id " + std::to_string(ids[c]) + " listed twice");
    else if (!(probs[c] >= 0.0f) || std::isinf(probs[c]))
      status = invalid_argument("q probability of id " + std::to_string(ids[c]) + " is not finite and ≥ 0");
    else
      seen[ids[c]] = 1;
  }
  for (int64_t c = 0; c < a.q_width; ++c)
    if (ids[c] >= 0 && ids[c] < a.vocab) seen[ids[c]] = 0;
  return status;
}

Status check(const SelectArgs& a) {
  if (a.vocab < 1 || a.vocab > INT32_MAX) return invalid_argument("vocab must be in [1, 2^31)");
  if (a.num_seqs < 0 || a.max_drafts < 0) return invalid_argument("num_seqs and max_drafts must be ≥ 0");
  if (a.num_seqs == 0) return ok_status();
  if (!a.logits || !a.seqs || !a.tokens || !a.accepted)
    return invalid_argument("logits, seqs, tokens and accepted are required");
  if (a.q_ids && (!a.q_probs || a.q_width < 1 || a.q_width > kMaxQWidth))
    return invalid_argument("q_ids needs q_probs and 1 ≤ q_width ≤ 256");
  std::vector<char> seen(a.q_ids ? static_cast<size_t>(a.vocab) : 0);
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const SelectSeq& seq = a.seqs[s];
    const std::string where = "sequence " + std::to_string(s);
    if (seq.first_row < 0) return invalid_argument(where + ": first_row < 0");
    if (seq.num_drafts < 0 || seq.num_drafts > a.max_drafts)
      return invalid_argument(where + ": num_drafts must be in [0, max_drafts]");
    if (seq.num_drafts > 0) {
      if (!a.drafts || seq.draft_offset < 0) return invalid_argument(where + ": drafts missing or draft_offset < 0");
      for (int32_t i = 0; i < seq.num_drafts; ++i) {
        const int32_t x = a.drafts[seq.draft_offset + i];
        if (x < 0 || x >= a.vocab)
          return invalid_argument(where + ": draft " + std::to_string(x) + " out of [0, vocab)");
        if (a.q_ids) KILN_RETURN_IF_ERROR(check_q_row(a, seq.draft_offset + i, seen).with_context(where));
      }
    }
    if (greedy(seq.params)) continue;
    if (!a.uniforms || seq.u_offset < 0) return invalid_argument(where + ": uniforms missing or u_offset < 0");
    for (int32_t i = 0; i <= seq.num_drafts; ++i)
      if (!valid_uniform(a.uniforms[seq.u_offset + i])) return invalid_argument(where + ": uniform outside [0, 1)");
  }
  return ok_status();
}

// Rows i < K up to the first rejection, then the correction or bonus; returns the number of drafts accepted.
int64_t verify_sampled(const SelectArgs& a, const SelectSeq& seq, int32_t* out, std::vector<float>& p,
                       std::vector<float>& q, std::vector<float>& residual) {
  const int64_t vocab = a.vocab;
  const SamplingParams params{seq.params.temperature, seq.params.top_k, seq.params.top_p};
  const double* u = a.uniforms + seq.u_offset;
  const int64_t k = seq.num_drafts;
  for (int64_t i = 0; i < k; ++i) {
    sampling_distribution(a.logits + (seq.first_row + i) * vocab, vocab, params, p.data());
    const int32_t x = a.drafts[seq.draft_offset + i];
    std::fill(q.begin(), q.end(), 0.0f);
    if (a.q_ids) {
      const int64_t q_row = (seq.draft_offset + i) * a.q_width;
      for (int64_t c = 0; c < a.q_width; ++c)
        if (a.q_ids[q_row + c] >= 0) q[a.q_ids[q_row + c]] = a.q_probs[q_row + c];
    } else {
      q[x] = 1.0f;
    }
    // u < p/q without dividing: q(x) = 0 (a draft its own distribution never proposes) is accepted iff p(x) > 0.
    if (u[i] * static_cast<double>(q[x]) < static_cast<double>(p[x])) {
      out[i] = x;
      continue;
    }
    double mass = 0.0;
    for (int64_t t = 0; t < vocab; ++t) {
      residual[t] = std::max(p[t] - q[t], 0.0f);
      mass += residual[t];
    }
    // A rejection implies p(x) < q(x), so p ≠ q and the residual has mass; rounding can still leave none.
    out[i] = sample_from_distribution_u(mass > 0.0 ? residual.data() : p.data(), vocab, u[k]);
    return i;
  }
  sampling_distribution(a.logits + (seq.first_row + k) * vocab, vocab, params, p.data());
  out[k] = sample_from_distribution_u(p.data(), vocab, u[k]);
  return k;
}

int64_t verify_greedy(const SelectArgs& a, const SelectSeq& seq, int32_t* out) {
  for (int64_t i = 0;; ++i) {
    const int32_t best = argmax(a.logits + (seq.first_row + i) * a.vocab, a.vocab);
    out[i] = best;
    if (i == seq.num_drafts || a.drafts[seq.draft_offset + i] != best) return i;
  }
}

Status check(const DraftSampleArgs& a) {
  if (a.vocab < 1 || a.vocab > INT32_MAX) return invalid_argument("vocab must be in [1, 2^31)");
  if (a.q_width < 1 || a.q_width > kMaxQWidth) return invalid_argument("q_width must be in [1, 256]");
  if (a.rows < 0) return invalid_argument("rows must be ≥ 0");
  if (a.rows == 0) return ok_status();
  if (!a.logits || !a.temperatures || !a.tokens || !a.q_ids || !a.q_probs)
    return invalid_argument("logits, temperatures, tokens, q_ids and q_probs are required");
  for (int64_t r = 0; r < a.rows; ++r) {
    if (a.temperatures[r] <= 0.0f) continue;
    if (!a.uniforms || !valid_uniform(a.uniforms[r]))
      return invalid_argument("row " + std::to_string(r) + ": uniform missing or outside [0, 1)");
  }
  return ok_status();
}

}  // namespace

double uniform_53(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1p-53;
}

int32_t sample_from_distribution_u(const float* probs, int64_t vocab, double u) {
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
  return last_nonzero;  // rounding left `running` a hair below `target`
}

Status select_tokens(const SelectArgs& args) {
  KILN_RETURN_IF_ERROR(check(args).with_context("cpu::select_tokens"));
  std::vector<float> p, q, residual;
  for (int64_t s = 0; s < args.num_seqs; ++s) {
    const SelectSeq& seq = args.seqs[s];
    int32_t* out = args.tokens + s * (args.max_drafts + 1);
    std::fill(out, out + args.max_drafts + 1, -1);
    if (greedy(seq.params)) {
      args.accepted[s] = static_cast<int32_t>(verify_greedy(args, seq, out));
      continue;
    }
    p.resize(args.vocab);
    q.resize(args.vocab);
    residual.resize(args.vocab);
    args.accepted[s] = static_cast<int32_t>(verify_sampled(args, seq, out, p, q, residual));
  }
  return ok_status();
}

Status sample_drafts(const DraftSampleArgs& args) {
  KILN_RETURN_IF_ERROR(check(args).with_context("cpu::sample_drafts"));
  const int64_t vocab = args.vocab, width = args.q_width;
  const int64_t n = std::min(width, vocab);
  std::vector<float> probs(static_cast<size_t>(vocab));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t r = 0; r < args.rows; ++r) {
    const float* logits = args.logits + r * vocab;
    int32_t* q_ids = args.q_ids + r * width;
    float* q_probs = args.q_probs + r * width;
    std::fill(q_ids, q_ids + width, -1);
    std::fill(q_probs, q_probs + width, 0.0f);
    if (args.temperatures[r] <= 0.0f) {
      args.tokens[r] = argmax(logits, vocab);
      continue;
    }
    sampling_distribution(logits, vocab, {args.temperatures[r], width, 1.0f}, probs.data());
    topk_indices(logits, vocab, n, ids.data());  // the candidates sampling_distribution kept
    std::sort(ids.begin(), ids.end());
    for (int64_t c = 0; c < n; ++c) {
      q_ids[c] = ids[c];
      q_probs[c] = probs[ids[c]];
    }
    args.tokens[r] = sample_from_distribution_u(probs.data(), vocab, args.uniforms[r]);
  }
  return ok_status();
}

}  // namespace kiln::cpu
