#include "model/host_token_select.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kiln {

namespace {
bool greedy_params(const TokenSelection& s) { return s.temperature <= 0.0f || s.top_k == 1; }
bool has_q(const TokenSelection& s) { return s.select && s.num_drafts > 0 && s.q_ids; }
}  // namespace

Status check_logit_adjustments(const TokenSelection& s, int64_t vocab) {
  if (s.adjustments.empty()) return ok_status();
  const int64_t rows = s.num_drafts + 1, n = static_cast<int64_t>(s.adjustments.size());
  if (static_cast<int64_t>(s.adjustment_offsets.size()) != rows + 1)
    return invalid_argument(std::to_string(s.adjustment_offsets.size()) + " adjustment offsets for " +
                            std::to_string(rows) + " rows");
  for (int64_t r = 0; r <= rows; ++r) {
    const int32_t o = s.adjustment_offsets[r];
    if (o < 0 || o > n || (r > 0 && o < s.adjustment_offsets[r - 1]) || (r == 0 && o != 0) || (r == rows && o != n))
      return invalid_argument("adjustment offsets are not a partition of the " + std::to_string(n) + " adjustments");
  }
  for (const LogitAdjustment& a : s.adjustments)
    if (a.token < 0 || a.token >= vocab || !(a.repetition > 0.0f))
      return invalid_argument("logit adjustment of token " + std::to_string(a.token) + " (vocabulary " +
                              std::to_string(vocab) + ", repetition " + std::to_string(a.repetition) + ")");
  return ok_status();
}

void apply_logit_adjustments(float* row, std::span<const LogitAdjustment> adjustments) {
  for (const LogitAdjustment& a : adjustments) {
    float x = row[a.token] + a.bias;
    if (a.repetition != 1.0f) x = x > 0.0f ? x / a.repetition : x * a.repetition;
    row[a.token] = x + a.add;
  }
}

void apply_min_p(float* row, int64_t vocab, float min_p, float temperature) {
  // p_v ≥ min_p · p_max  ⇔  x_v ≥ x_max + T · ln(min_p): a threshold on the logits, so no softmax is needed.
  float max = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v)
    if (row[v] > max) max = row[v];
  if (!std::isfinite(max)) return;
  const double threshold = static_cast<double>(max) + static_cast<double>(temperature) * std::log(static_cast<double>(min_p));
  for (int64_t v = 0; v < vocab; ++v)
    if (static_cast<double>(row[v]) < threshold) row[v] = -INFINITY;
}

Status plan_selection(std::span<const int64_t> first_row, std::span<const TokenSelection> select, SelectionPlan& plan) {
  plan = SelectionPlan{};
  // q rows: one shared buffer (rows q_width apart from the lowest) when every entry with q has the same width and
  // sits on that grid, its probabilities likewise in theirs; the drafts array is then laid out on the same rows.
  // A sampled entry whose drafts came without q (greedy drafts: one-hot q) beside entries with q needs packing.
  const int32_t* base = nullptr;
  bool sampled_without_q = false;
  for (const TokenSelection& s : select) {
    if (has_q(s)) {
      if (plan.q_width == 0) plan.q_width = s.q_width;
      if (s.q_width != plan.q_width) plan.needs_q_pack = true;
      if (!base || s.q_ids < base) base = s.q_ids;
    } else if (s.select && s.num_drafts > 0 && !greedy_params(s)) {
      sampled_without_q = true;
    }
  }
  if (base && sampled_without_q) plan.needs_q_pack = true;
  const float* probs_base = nullptr;
  int64_t next_draft = 0;  // past every grid row, where entries off the grid go
  if (base && !plan.needs_q_pack)
    for (const TokenSelection& s : select) {
      if (!has_q(s)) continue;
      const std::ptrdiff_t d = s.q_ids - base;
      if (!probs_base) probs_base = s.q_probs - d;
      if (d % plan.q_width != 0 || s.q_probs - d != probs_base) plan.needs_q_pack = true;
      next_draft = std::max<int64_t>(next_draft, d / plan.q_width + s.num_drafts);
    }
  if (plan.needs_q_pack) next_draft = 0;
  for (size_t i = 0; i < select.size(); ++i) {
    const TokenSelection& s = select[i];
    if (!s.select) continue;
    if (i >= first_row.size()) return internal_error("token selection for a step without logits");
    if (s.num_drafts < 0 || static_cast<int64_t>(s.drafts.size()) != s.num_drafts)
      return invalid_argument("token selection of entry " + std::to_string(i) + ": " + std::to_string(s.num_drafts) +
                              " drafts announced, " + std::to_string(s.drafts.size()) + " given");
    const bool greedy = greedy_params(s);
    if (!greedy && static_cast<int64_t>(s.uniforms.size()) != s.num_drafts + 1)
      return invalid_argument("token selection of entry " + std::to_string(i) + " needs " +
                              std::to_string(s.num_drafts + 1) + " uniforms, got " + std::to_string(s.uniforms.size()));
    if (s.q_ids && (s.q_width < 1 || s.q_width > cpu::kMaxQWidth || !s.q_probs))
      return invalid_argument("token selection of entry " + std::to_string(i) + ": q width " +
                              std::to_string(s.q_width) + " outside 1.." + std::to_string(cpu::kMaxQWidth));
    cpu::SelectSeq row{};
    row.first_row = static_cast<int32_t>(first_row[i]);
    row.num_drafts = s.num_drafts;
    const bool on_grid = has_q(s) && !plan.needs_q_pack;
    row.draft_offset = static_cast<int32_t>(on_grid ? (s.q_ids - base) / plan.q_width : next_draft);
    if (!on_grid) next_draft += s.num_drafts;
    row.u_offset = static_cast<int32_t>(plan.uniforms.size());
    row.params = {s.temperature, s.top_k, s.top_p};
    const int64_t end = row.draft_offset + s.num_drafts;
    if (static_cast<int64_t>(plan.drafts.size()) < end) plan.drafts.resize(end, 0);
    std::copy(s.drafts.begin(), s.drafts.end(), plan.drafts.begin() + row.draft_offset);
    if (!greedy) plan.uniforms.insert(plan.uniforms.end(), s.uniforms.begin(), s.uniforms.end());
    plan.max_drafts = std::max<int64_t>(plan.max_drafts, s.num_drafts);
    plan.seqs.push_back(row);
    plan.entries.push_back(i);
  }
  if (base && !plan.needs_q_pack) {
    plan.q_ids = base;
    plan.q_probs = probs_base;
  }
  return ok_status();
}

void unpack_selection(const SelectionPlan& plan, size_t num_steps, const int32_t* tokens, const int32_t* accepted,
                      StepOutput& out) {
  out.tokens.assign(num_steps, {});
  out.accepted.assign(num_steps, 0);
  const int64_t stride = plan.max_drafts + 1;
  for (size_t j = 0; j < plan.entries.size(); ++j) {
    const size_t i = plan.entries[j];
    const int64_t a = accepted[j];
    out.accepted[i] = a;
    out.tokens[i].assign(tokens + j * stride, tokens + j * stride + a + 1);
  }
}

TokenLogprobs token_logprobs(const float* row, int64_t vocab, int32_t token, int32_t top_n) {
  float max = row[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max(max, row[v]);
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
  const double log_z = max + std::log(sum);
  TokenLogprobs out;
  out.logprob = static_cast<float>(row[token] - log_z);
  const int64_t n = std::min<int64_t>(top_n, vocab);
  if (n <= 0) return out;
  std::vector<int32_t> ids(vocab);
  for (int64_t v = 0; v < vocab; ++v) ids[v] = static_cast<int32_t>(v);
  // Ties go to the lower id, as a stable argmax would.
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  for (int64_t k = 0; k < n; ++k) out.top.emplace_back(ids[k], static_cast<float>(row[ids[k]] - log_z));
  return out;
}

Status select_tokens_host(const float* logits, int64_t vocab, std::span<const int64_t> first_row,
                          std::span<const TokenSelection> select, StepOutput& out) {
  SelectionPlan plan;
  KILN_RETURN_IF_ERROR(plan_selection(first_row, select, plan));
  // Host q in different buffers: pack them into one, rows at the entries' draft offsets.
  std::vector<int32_t> q_ids;
  std::vector<float> q_probs;
  if (plan.needs_q_pack) {
    q_ids.assign(plan.drafts.size() * cpu::kMaxQWidth, -1);
    q_probs.assign(q_ids.size(), 0.0f);
    for (size_t j = 0; j < plan.entries.size(); ++j) {
      const TokenSelection& s = select[plan.entries[j]];
      for (int64_t k = 0; k < s.num_drafts; ++k) {
        const int64_t row = (plan.seqs[j].draft_offset + k) * cpu::kMaxQWidth;
        if (!s.q_ids) {  // greedy drafts: q one-hot at the draft
          q_ids[row] = s.drafts[k];
          q_probs[row] = 1.0f;
          continue;
        }
        for (int64_t c = 0; c < s.q_width; ++c) {
          q_ids[row + c] = s.q_ids[k * s.q_width + c];
          q_probs[row + c] = s.q_probs[k * s.q_width + c];
        }
      }
    }
    plan.q_width = cpu::kMaxQWidth, plan.q_ids = q_ids.data(), plan.q_probs = q_probs.data();
  }
  // Entries with penalties, logit_bias, masks or min_p select from adjusted rows, in a copy: logprobs below stay
  // the model's own distribution.
  const float* select_logits = logits;
  std::vector<float> adjusted;
  for (size_t i = 0; i < select.size(); ++i) {
    const TokenSelection& s = select[i];
    const bool min_p = s.min_p > 0.0f && !greedy_params(s);
    if (!s.select || (s.allowed.empty() && s.adjustments.empty() && !min_p)) continue;
    const int64_t words = token_mask_words(vocab), rows = s.num_drafts + 1;
    if (!s.allowed.empty() && static_cast<int64_t>(s.allowed.size()) != rows * words)
      return invalid_argument("token selection of entry " + std::to_string(i) + ": a token mask of " +
                              std::to_string(s.allowed.size()) + " words for " + std::to_string(rows) + " rows of " +
                              std::to_string(words));
    KILN_RETURN_IF_ERROR(check_logit_adjustments(s, vocab).with_context("token selection of entry " + std::to_string(i)));
    if (adjusted.empty()) {
      int64_t total_rows = 0;
      for (size_t j = 0; j < select.size(); ++j)
        if (select[j].select) total_rows = std::max<int64_t>(total_rows, first_row[j] + select[j].num_drafts + 1);
      adjusted.assign(logits, logits + total_rows * vocab);
      select_logits = adjusted.data();
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* row = adjusted.data() + (first_row[i] + r) * vocab;
      if (!s.adjustments.empty())
        apply_logit_adjustments(row, s.adjustments.subspan(s.adjustment_offsets[r],
                                                           s.adjustment_offsets[r + 1] - s.adjustment_offsets[r]));
      if (!s.allowed.empty()) {
        const uint32_t* bits = s.allowed.data() + r * words;
        for (int64_t v = 0; v < vocab; ++v)
          if (!token_allowed(bits, static_cast<int32_t>(v))) row[v] = -INFINITY;
      }
      if (min_p) apply_min_p(row, vocab, s.min_p, s.temperature);
    }
  }
  std::vector<int32_t> tokens(plan.seqs.size() * (plan.max_drafts + 1)), accepted(plan.seqs.size());
  cpu::SelectArgs a{};
  a.logits = select_logits, a.vocab = vocab;
  a.seqs = plan.seqs.data(), a.num_seqs = static_cast<int64_t>(plan.seqs.size());
  a.drafts = plan.drafts.data(), a.q_ids = plan.q_ids, a.q_probs = plan.q_probs, a.q_width = plan.q_width;
  a.uniforms = plan.uniforms.data(), a.tokens = tokens.data(), a.accepted = accepted.data(), a.max_drafts = plan.max_drafts;
  KILN_RETURN_IF_ERROR(cpu::select_tokens(a));
  unpack_selection(plan, select.size(), tokens.data(), accepted.data(), out);
  out.logprobs.assign(select.size(), {});
  for (size_t i = 0; i < select.size(); ++i) {
    if (!select[i].select || select[i].logprobs < 0) continue;
    for (size_t t = 0; t < out.tokens[i].size(); ++t)
      out.logprobs[i].push_back(
          token_logprobs(logits + (first_row[i] + static_cast<int64_t>(t)) * vocab, vocab, out.tokens[i][t],
                         select[i].logprobs));
  }
  return ok_status();
}

Status sample_drafts_host(const DraftSampleRequest& r, int64_t vocab) {
  if (r.rows == 0) return ok_status();
  const int64_t C = r.q_width, stride = r.q_row_stride > 0 ? r.q_row_stride : r.q_width;
  std::vector<int32_t> ids(r.rows * std::max<int64_t>(C, 1));
  std::vector<float> probs(ids.size());
  cpu::DraftSampleArgs a{};
  a.logits = r.logits, a.rows = r.rows, a.vocab = vocab, a.temperatures = r.temperatures, a.uniforms = r.uniforms;
  a.q_width = C, a.tokens = r.tokens, a.q_ids = ids.data(), a.q_probs = probs.data();
  KILN_RETURN_IF_ERROR(cpu::sample_drafts(a));
  for (int64_t row = 0; row < r.rows; ++row) {
    if (r.q_ids) std::copy_n(ids.data() + row * C, C, r.q_ids + row * stride);
    if (r.q_probs) std::copy_n(probs.data() + row * C, C, r.q_probs + row * stride);
  }
  return ok_status();
}

}  // namespace kiln
