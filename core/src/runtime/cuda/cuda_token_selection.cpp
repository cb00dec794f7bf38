#include "runtime/cuda/cuda_token_selection.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/logit_adjust.h"
#include "kernels/cuda/logprobs.h"
#include "kernels/cuda/token_mask.h"
#include "kernels/cuda/token_select.h"
#include "kernels/cuda/topk.h"
#include "model/host_token_select.h"

namespace kiln::cuda {
namespace {

Status ok_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string("token selection: ") + what + ": " + cudaGetErrorString(e));
}

size_t up256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

Status DeviceTokenSelection::select(float* logits, int64_t vocab, std::span<const int64_t> first_row,
                                    std::span<const TokenSelection> select, cudaStream_t stream, StepOutput& out) {
  SelectionPlan plan;
  KILN_RETURN_IF_ERROR(plan_selection(first_row, select, plan));
  const size_t n = plan.seqs.size();
  out.logprobs.assign(select.size(), {});
  if (n == 0) {
    unpack_selection(plan, select.size(), nullptr, nullptr, out);
    return ok_status();
  }
  // Per selected row, what the host selection does to it, in its order (host_token_select.cpp): the entry's logit
  // adjustments, then its token mask, then (sampled entries) the min_p cut — each a kernel over the rows that need
  // it, so a row sees them in that order. Rows are modified in place: the step's logits are not read after this (a
  // host copy of them was queued before), but logprobs are the model's own, so what they need is taken first.
  const int64_t words = token_mask_words(vocab);
  std::vector<int32_t> mask_rows, adjusted_rows, adjustment_offsets{0}, min_p_rows, logprob_rows;
  std::vector<double> min_p_offsets;
  std::vector<int32_t> logprob_first(n, -1), adjusted_first(n, -1);
  size_t adjustments = 0;
  int64_t top_n = 0;
  for (size_t j = 0; j < n; ++j) {
    const size_t i = plan.entries[j];
    const TokenSelection& s = select[i];
    const int64_t rows = s.num_drafts + 1;
    const std::string entry = "token selection of entry " + std::to_string(i);
    if (!s.allowed.empty()) {
      if (static_cast<int64_t>(s.allowed.size()) != rows * words)
        return invalid_argument(entry + ": a token mask of " + std::to_string(s.allowed.size()) + " words for " +
                                std::to_string(rows) + " rows of " + std::to_string(words));
      for (int64_t r = 0; r < rows; ++r) mask_rows.push_back(static_cast<int32_t>(first_row[i] + r));
    }
    if (!s.adjustments.empty()) {
      KILN_RETURN_IF_ERROR(check_logit_adjustments(s, vocab).with_context(entry));
      adjusted_first[j] = static_cast<int32_t>(adjusted_rows.size());
      for (int64_t r = 0; r < rows; ++r) {
        adjusted_rows.push_back(static_cast<int32_t>(first_row[i] + r));
        adjustment_offsets.push_back(static_cast<int32_t>(adjustments + s.adjustment_offsets[r + 1]));
      }
      adjustments += s.adjustments.size();
    }
    if (s.min_p > 0.0f && !(s.temperature <= 0.0f || s.top_k == 1)) {
      // The threshold's offset as apply_min_p forms it; the device adds it to the row's max.
      const double offset = static_cast<double>(s.temperature) * std::log(static_cast<double>(s.min_p));
      for (int64_t r = 0; r < rows; ++r) {
        min_p_rows.push_back(static_cast<int32_t>(first_row[i] + r));
        min_p_offsets.push_back(offset);
      }
    }
    if (s.logprobs >= 0) {
      logprob_first[j] = static_cast<int32_t>(logprob_rows.size());
      for (int64_t r = 0; r < rows; ++r) logprob_rows.push_back(static_cast<int32_t>(first_row[i] + r));
      top_n = std::max<int64_t>(top_n, std::min<int64_t>(s.logprobs, vocab));
    }
  }
  if (top_n > kMaxTopK)
    return invalid_argument("token selection: at most " + std::to_string(kMaxTopK) + " top logprobs, asked for " +
                            std::to_string(top_n));
  const size_t masked = mask_rows.size(), adjusted = adjusted_rows.size(), cut = min_p_rows.size();
  const size_t adjusted_offsets = adjusted > 0 ? adjusted + 1 : 0;
  const size_t lp = logprob_rows.size(), top = lp * static_cast<size_t>(top_n);
  const size_t drafts = plan.drafts.size(), uniforms = plan.uniforms.size();
  const size_t stride = static_cast<size_t>(plan.max_drafts + 1);
  const size_t q_rows = plan.needs_q_pack ? drafts : 0;
  // Host → device, one copy: seqs | drafts | uniforms | one-hot q rows (packing only) | masked rows | their masks |
  // adjusted rows | their offsets | adjustments | min_p rows | their offsets | logprob rows | per sequence: its first
  // logprob row, its first adjusted row. Device only: select workspace | adjusted logits' originals.
  // Device → host, one copy: tokens | accepted | selected logits | log_z | top ids | top logits.
  const size_t up_seqs = 0, up_drafts = up256(sizeof(cpu::SelectSeq) * n), up_u = up_drafts + up256(4 * drafts);
  const size_t up_q = up_u + up256(8 * uniforms), up_rows = up_q + up256(8 * q_rows * cpu::kMaxQWidth);
  const size_t up_masks = up_rows + up256(4 * masked), up_adj_rows = up_masks + up256(4 * masked * words);
  const size_t up_adj_offsets = up_adj_rows + up256(4 * adjusted);
  const size_t up_adj = up_adj_offsets + up256(4 * adjusted_offsets);
  const size_t up_cut_rows = up_adj + up256(sizeof(LogitAdjustment) * adjustments);
  const size_t up_cut_offsets = up_cut_rows + up256(4 * cut), up_lp_rows = up_cut_offsets + up256(8 * cut);
  const size_t per_seq = lp > 0 ? n : 0;  // the per-sequence tables only serve logprobs
  const size_t up_lp_first = up_lp_rows + up256(4 * lp), up_adj_first = up_lp_first + up256(4 * per_seq);
  const size_t up_end = up_adj_first + up256(4 * per_seq);
  const size_t down_tokens = 0, down_accepted = up256(4 * n * stride), down_values = down_accepted + up256(4 * n);
  const size_t down_log_z = down_values + up256(4 * lp), down_top_ids = down_log_z + up256(8 * lp);
  const size_t down_top_values = down_top_ids + up256(4 * top), down_end = down_top_values + up256(4 * top);
  const size_t ws = select_workspace_bytes(static_cast<int64_t>(n), plan.max_drafts);
  const size_t d_ws = up_end, d_original = d_ws + up256(ws), d_out = d_original + up256(4 * adjustments);
  const size_t d_end = d_out + down_end;
  KILN_RETURN_IF_ERROR(select_scratch_.ensure(d_end));
  KILN_RETURN_IF_ERROR(staging_.ensure(std::max(up_end, down_end)));
  select_scratch_.begin(false);
  char* dev = select_scratch_.carve<char>(d_end);
  char* host = staging_.data();
  auto put = [&](size_t at, const auto& v, size_t count) {
    if (count > 0) std::memcpy(host + at, v.data(), sizeof(v[0]) * count);
  };
  put(up_seqs, plan.seqs, n);
  put(up_drafts, plan.drafts, drafts);
  put(up_u, plan.uniforms, uniforms);
  auto* q_ids = reinterpret_cast<int32_t*>(dev + up_q);
  auto* q_probs = reinterpret_cast<float*>(dev + up_q + 4 * q_rows * cpu::kMaxQWidth);
  if (q_rows > 0) {  // one-hot rows for greedy drafts; the drafters' rows are copied in on the device below
    auto* hid = reinterpret_cast<int32_t*>(host + up_q);
    auto* hprob = reinterpret_cast<float*>(host + up_q + 4 * q_rows * cpu::kMaxQWidth);
    std::fill(hid, hid + q_rows * cpu::kMaxQWidth, -1);
    std::fill(hprob, hprob + q_rows * cpu::kMaxQWidth, 0.0f);
    for (size_t j = 0; j < n; ++j) {
      const TokenSelection& s = select[plan.entries[j]];
      if (s.q_ids) continue;
      for (int64_t k = 0; k < s.num_drafts; ++k) {
        hid[(plan.seqs[j].draft_offset + k) * cpu::kMaxQWidth] = s.drafts[k];
        hprob[(plan.seqs[j].draft_offset + k) * cpu::kMaxQWidth] = 1.0f;
      }
    }
  }
  put(up_rows, mask_rows, masked);
  put(up_adj_rows, adjusted_rows, adjusted);
  put(up_adj_offsets, adjustment_offsets, adjusted_offsets);
  put(up_cut_rows, min_p_rows, cut);
  put(up_cut_offsets, min_p_offsets, cut);
  put(up_lp_rows, logprob_rows, lp);
  put(up_lp_first, logprob_first, per_seq);
  put(up_adj_first, adjusted_first, per_seq);
  auto* words_out = reinterpret_cast<uint32_t*>(host + up_masks);
  auto* adj_out = reinterpret_cast<LogitAdjustment*>(host + up_adj);
  for (size_t j = 0; j < n; ++j) {
    const TokenSelection& s = select[plan.entries[j]];
    words_out = std::copy(s.allowed.begin(), s.allowed.end(), words_out);
    if (s.adjustments.empty()) continue;
    // Each row's adjustments ascending by token, so selected_logits can find a token's; a repeated token would be
    // applied twice at once (the host applies repeats one after the other), so it is refused.
    for (size_t r = 0; r + 1 < s.adjustment_offsets.size(); ++r) {
      LogitAdjustment* row = std::copy(s.adjustments.begin() + s.adjustment_offsets[r],
                                       s.adjustments.begin() + s.adjustment_offsets[r + 1], adj_out);
      auto by_token = [](const LogitAdjustment& a, const LogitAdjustment& b) { return a.token < b.token; };
      if (!std::is_sorted(adj_out, row, by_token)) std::sort(adj_out, row, by_token);
      const auto repeat = std::adjacent_find(
          adj_out, row, [](const LogitAdjustment& a, const LogitAdjustment& b) { return a.token == b.token; });
      if (repeat != row)
        return invalid_argument("token selection of entry " + std::to_string(plan.entries[j]) +
                                ": row " + std::to_string(r) + " adjusts token " + std::to_string(repeat->token) +
                                " twice");
      adj_out = row;
    }
  }
  KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpyAsync(dev, host, up_end, cudaMemcpyHostToDevice, stream), "upload"));
  auto* original = reinterpret_cast<float*>(dev + d_original);
  auto* values = reinterpret_cast<float*>(dev + d_out + down_values);
  auto* log_z = reinterpret_cast<double*>(dev + d_out + down_log_z);
  auto* top_ids = reinterpret_cast<int32_t*>(dev + d_out + down_top_ids);
  auto* top_values = reinterpret_cast<float*>(dev + d_out + down_top_values);
  const auto* adjustment_rows = reinterpret_cast<const int32_t*>(dev + up_adj_rows);
  const auto* adjustment_ranges = reinterpret_cast<const int32_t*>(dev + up_adj_offsets);
  const auto* adjustment_list = reinterpret_cast<const LogitAdjustment*>(dev + up_adj);
  // Logprobs first, from the rows as the model left them.
  if (lp > 0) {
    const auto* rows = reinterpret_cast<const int32_t*>(dev + up_lp_rows);
    if (top_n > 0)
      KILN_RETURN_IF_ERROR(topk_listed_rows(logits, rows, static_cast<int64_t>(lp), vocab, top_n, top_ids, stream));
    KILN_RETURN_IF_ERROR(logprob_row_stats(logits, vocab, rows, static_cast<int64_t>(lp), top_ids, top_n, log_z,
                                           top_values, stream));
  }
  KILN_RETURN_IF_ERROR(adjust_logits(logits, vocab, adjustment_rows, adjustment_ranges, adjustment_list, original,
                                     static_cast<int64_t>(adjusted), stream));
  KILN_RETURN_IF_ERROR(mask_disallowed_logits(logits, vocab, reinterpret_cast<const int32_t*>(dev + up_rows),
                                              reinterpret_cast<const uint32_t*>(dev + up_masks),
                                              static_cast<int64_t>(masked), stream));
  KILN_RETURN_IF_ERROR(apply_min_p_rows(logits, vocab, reinterpret_cast<const int32_t*>(dev + up_cut_rows),
                                        reinterpret_cast<const double*>(dev + up_cut_offsets),
                                        static_cast<int64_t>(cut), stream));
  for (size_t j = 0; q_rows > 0 && j < n; ++j) {
    const TokenSelection& s = select[plan.entries[j]];
    if (!s.q_ids || s.num_drafts == 0) continue;
    const size_t row = static_cast<size_t>(plan.seqs[j].draft_offset) * cpu::kMaxQWidth;
    const size_t pitch = cpu::kMaxQWidth * 4, width = static_cast<size_t>(s.q_width) * 4;
    KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpy2DAsync(q_ids + row, pitch, s.q_ids, width, width, s.num_drafts,
                                                   cudaMemcpyDeviceToDevice, stream), "q rows"));
    KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpy2DAsync(q_probs + row, pitch, s.q_probs, width, width, s.num_drafts,
                                                   cudaMemcpyDeviceToDevice, stream), "q rows"));
  }
  cpu::SelectArgs a{};
  a.logits = logits, a.vocab = vocab;
  a.seqs = reinterpret_cast<const cpu::SelectSeq*>(dev + up_seqs), a.num_seqs = static_cast<int64_t>(n);
  a.drafts = drafts ? reinterpret_cast<const int32_t*>(dev + up_drafts) : nullptr;
  if (q_rows > 0) {
    a.q_ids = q_ids, a.q_probs = q_probs, a.q_width = cpu::kMaxQWidth;
  } else {
    a.q_ids = plan.q_ids, a.q_probs = plan.q_probs, a.q_width = plan.q_width;
  }
  a.uniforms = uniforms ? reinterpret_cast<const double*>(dev + up_u) : nullptr;
  a.tokens = reinterpret_cast<int32_t*>(dev + d_out + down_tokens);
  a.accepted = reinterpret_cast<int32_t*>(dev + d_out + down_accepted);
  a.max_drafts = plan.max_drafts;
  KILN_RETURN_IF_ERROR(select_tokens(a, dev + d_ws, ws, stream));
  if (lp > 0) {
    SelectedLogitsArgs g{};
    g.logits = logits, g.vocab = vocab, g.seqs = a.seqs, g.num_seqs = a.num_seqs, g.max_drafts = a.max_drafts;
    g.tokens = a.tokens, g.accepted = a.accepted;
    g.logprob_row = reinterpret_cast<const int32_t*>(dev + up_lp_first);
    g.adjusted_row = reinterpret_cast<const int32_t*>(dev + up_adj_first);
    g.adjustment_offsets = adjustment_ranges, g.adjustments = adjustment_list, g.original = original;
    g.values = values;
    KILN_RETURN_IF_ERROR(selected_logits(g, stream));
  }
  KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpyAsync(host, dev + d_out, down_end, cudaMemcpyDeviceToHost, stream), "download"));
  KILN_RETURN_IF_ERROR(ok_cuda(cudaStreamSynchronize(stream), "step"));
  unpack_selection(plan, select.size(), reinterpret_cast<const int32_t*>(host + down_tokens),
                   reinterpret_cast<const int32_t*>(host + down_accepted), out);
  // Logprobs as token_logprobs forms them: the logit (fp32) minus log_z (fp64), rounded to fp32.
  const auto* h_values = reinterpret_cast<const float*>(host + down_values);
  const auto* h_log_z = reinterpret_cast<const double*>(host + down_log_z);
  const auto* h_top_ids = reinterpret_cast<const int32_t*>(host + down_top_ids);
  const auto* h_top_values = reinterpret_cast<const float*>(host + down_top_values);
  for (size_t j = 0; j < n; ++j) {
    if (logprob_first[j] < 0) continue;
    const size_t i = plan.entries[j];
    const int64_t want = std::min<int64_t>(select[i].logprobs, vocab);
    for (size_t t = 0; t < out.tokens[i].size(); ++t) {
      const size_t r = static_cast<size_t>(logprob_first[j]) + t;
      TokenLogprobs l;
      l.logprob = static_cast<float>(static_cast<double>(h_values[r]) - h_log_z[r]);
      for (int64_t k = 0; k < want; ++k) {
        const int32_t id = h_top_ids[r * top_n + k];
        if (id < 0) break;
        l.top.emplace_back(id, static_cast<float>(static_cast<double>(h_top_values[r * top_n + k]) - h_log_z[r]));
      }
      out.logprobs[i].push_back(std::move(l));
    }
  }
  return ok_status();
}

Status DeviceTokenSelection::sample_drafts(const DraftSampleRequest& r, int64_t vocab, cudaStream_t stream) {
  if (r.rows == 0) return ok_status();
  if (!r.logits || !r.tokens || !r.temperatures || !r.uniforms)
    return invalid_argument("draft sampling needs logits, tokens, temperatures and uniforms");
  const int64_t C = r.q_width, stride = r.q_row_stride > 0 ? r.q_row_stride : C;
  const size_t rows = static_cast<size_t>(r.rows);
  const size_t t_off = 0, u_off = up256(4 * rows), ids_off = u_off + up256(8 * rows);
  const size_t probs_off = ids_off + up256(4 * rows * C), end = probs_off + up256(4 * rows * C);
  KILN_RETURN_IF_ERROR(draft_scratch_.ensure(end));
  draft_scratch_.begin(false);
  char* dev = draft_scratch_.carve<char>(end);
  // Pageable sources: each copy has taken its bytes when it returns, so back-to-back calls cannot race.
  KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpyAsync(dev + t_off, r.temperatures, 4 * rows, cudaMemcpyHostToDevice, stream), "upload"));
  KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpyAsync(dev + u_off, r.uniforms, 8 * rows, cudaMemcpyHostToDevice, stream), "upload"));
  cpu::DraftSampleArgs a{};
  a.logits = r.logits, a.rows = r.rows, a.vocab = vocab;
  a.temperatures = reinterpret_cast<const float*>(dev + t_off), a.uniforms = reinterpret_cast<const double*>(dev + u_off);
  a.q_width = C, a.tokens = r.tokens;
  a.q_ids = reinterpret_cast<int32_t*>(dev + ids_off), a.q_probs = reinterpret_cast<float*>(dev + probs_off);
  KILN_RETURN_IF_ERROR(kiln::cuda::sample_drafts(a, stream));
  const size_t width = static_cast<size_t>(C) * 4, pitch = static_cast<size_t>(stride) * 4;
  if (r.q_ids)
    KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpy2DAsync(r.q_ids, pitch, a.q_ids, width, width, rows, cudaMemcpyDeviceToDevice,
                                                   stream), "q rows"));
  if (r.q_probs)
    KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpy2DAsync(r.q_probs, pitch, a.q_probs, width, width, rows,
                                                   cudaMemcpyDeviceToDevice, stream), "q rows"));
  return ok_status();
}

}  // namespace kiln::cuda
