#include "runtime/cuda/cuda_token_selection.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/token_mask.h"
#include "kernels/cuda/token_select.h"
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
  if (n == 0) {
    unpack_selection(plan, select.size(), nullptr, nullptr, out);
    return ok_status();
  }
  // Constrained entries: their allowed-token rows (one per selected row: t_L's, then each draft's) go up with the
  // rest, and the logits rows are masked in place before selection. The step's logits are not read after it (a
  // host copy of them was queued before).
  const int64_t words = token_mask_words(vocab);
  std::vector<int32_t> mask_rows;
  for (size_t i = 0; i < select.size(); ++i) {
    const TokenSelection& s = select[i];
    if (!s.select || s.allowed.empty()) continue;
    const int64_t rows = s.num_drafts + 1;
    if (static_cast<int64_t>(s.allowed.size()) != rows * words)
      return invalid_argument("token selection of entry " + std::to_string(i) + ": a token mask of " +
                              std::to_string(s.allowed.size()) + " words for " + std::to_string(rows) + " rows of " +
                              std::to_string(words));
    for (int64_t r = 0; r < rows; ++r) mask_rows.push_back(static_cast<int32_t>(first_row[i] + r));
  }
  const size_t masked = mask_rows.size();
  const size_t drafts = plan.drafts.size(), uniforms = plan.uniforms.size();
  const size_t stride = static_cast<size_t>(plan.max_drafts + 1);
  const size_t q_rows = plan.needs_q_pack ? drafts : 0;
  // Host → device: seqs | drafts | uniforms | one-hot q rows (packing only) | masked rows | their masks;
  // device → host: tokens | accepted.
  const size_t up_seqs = 0, up_drafts = up256(sizeof(cpu::SelectSeq) * n), up_u = up_drafts + up256(4 * drafts);
  const size_t up_q = up_u + up256(8 * uniforms), up_rows = up_q + up256(8 * q_rows * cpu::kMaxQWidth);
  const size_t up_masks = up_rows + up256(4 * masked), up_end = up_masks + up256(4 * masked * words);
  const size_t down_tokens = 0, down_accepted = up256(4 * n * stride), down_end = down_accepted + up256(4 * n);
  const size_t ws = select_workspace_bytes(static_cast<int64_t>(n), plan.max_drafts);
  const size_t d_ws = up_end, d_out = d_ws + up256(ws), d_end = d_out + down_end;
  KILN_RETURN_IF_ERROR(select_scratch_.ensure(d_end));
  KILN_RETURN_IF_ERROR(staging_.ensure(std::max(up_end, down_end)));
  select_scratch_.begin(false);
  char* dev = select_scratch_.carve<char>(d_end);
  char* host = staging_.data();
  std::memcpy(host + up_seqs, plan.seqs.data(), sizeof(cpu::SelectSeq) * n);
  std::memcpy(host + up_drafts, plan.drafts.data(), 4 * drafts);
  std::memcpy(host + up_u, plan.uniforms.data(), 8 * uniforms);
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
  if (masked > 0) {
    std::memcpy(host + up_rows, mask_rows.data(), 4 * masked);
    auto* words_out = reinterpret_cast<uint32_t*>(host + up_masks);
    for (const TokenSelection& s : select)
      if (s.select && !s.allowed.empty()) words_out = std::copy(s.allowed.begin(), s.allowed.end(), words_out);
  }
  KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpyAsync(dev, host, up_end, cudaMemcpyHostToDevice, stream), "upload"));
  if (masked > 0)
    KILN_RETURN_IF_ERROR(mask_disallowed_logits(logits, vocab, reinterpret_cast<const int32_t*>(dev + up_rows),
                                                reinterpret_cast<const uint32_t*>(dev + up_masks),
                                                static_cast<int64_t>(masked), stream));
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
  KILN_RETURN_IF_ERROR(ok_cuda(cudaMemcpyAsync(host, dev + d_out, down_end, cudaMemcpyDeviceToHost, stream), "download"));
  KILN_RETURN_IF_ERROR(ok_cuda(cudaStreamSynchronize(stream), "step"));
  unpack_selection(plan, select.size(), reinterpret_cast<const int32_t*>(host + down_tokens),
                   reinterpret_cast<const int32_t*>(host + down_accepted), out);
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
