// Decode-context parallelism on CUDA ranks (cuda_model_step.h: split_context_attend, split_context_rows). The group
// is the whole tensor-parallel group (CudaMlaMoeModel::Impl::context); its meetings are all_gathers of the step's
// collective on the step's stream, so a step over NCCL can still be captured into a CUDA graph.
#include <algorithm>
#include <vector>

#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/split_context_merge.h"

namespace kiln::cuda {

Status split_context_attend(const StepContext& x, const void* pages, float scale) {
  const ModelConfig& c = x.c;
  CudaMlaMoeModel::Impl& I = x.I;
  const StepBuffers& b = x.b;
  const int64_t N = x.shape.N, H = c.num_attention_heads, L = c.kv_lora_rank, D = L + c.qk_rope_head_dim;
  // 1. Every head's absorbed queries on every rank (each rank absorbed its own heads').
  KILN_RETURN_IF_ERROR(gather_units(x, b.q_abs, N, H, D, DType::kF32, b.q_group).with_context("query gather"));
  // 2. Every head over this rank's own tokens (b.kv_len counts those a row sees), with each pair's log-sum-exp.
  MlaAttendArgs a;
  a.cache = pages, a.num_queries = N, a.num_heads = H, a.q = b.q_group;
  a.block_tables = b.tables, a.max_blocks = x.shape.max_blocks, a.query_seq = b.query_seq, a.kv_len = b.kv_len;
  a.scale = scale, a.out = b.ctx_part, a.out_lse = b.ctx_lse;
  a.max_kv_len = x.shape.attend_shape.max_kv_len;
  a.num_splits = x.shape.attend.num_splits, a.split_by_length = x.shape.attend.split_by_length;
  a.workspace = b.mla_workspace, a.workspace_bytes = x.shape.attend.workspace_bytes;
  KILN_RETURN_IF_ERROR(I.layout->attend(a, I.sdk_stream()).with_context("attention over this rank's tokens"));
  // 3. Every rank's partial results, merged in rank order on every rank; each keeps its own heads' rows.
  KILN_RETURN_IF_ERROR(I.collective->all_gather(b.ctx_part, b.ctx_parts, N * H * L, DType::kF32, I.sdk_stream())
                           .with_context("partial attention gather"));
  KILN_RETURN_IF_ERROR(I.collective->all_gather(b.ctx_lse, b.ctx_lses, N * H, DType::kF32, I.sdk_stream())
                           .with_context("log-sum-exp gather"));
  return merge_attention_parts_bf16(b.ctx_parts, b.ctx_lses, I.context.world, N, H, L, I.shard.begin(H),
                                    I.shard.count(H), b.o_lat_bf, I.s());
}

Status split_context_rows(const StepContext& x, const void* pages, uint16_t* latent) {
  const ModelConfig& c = x.c;
  CudaMlaMoeModel::Impl& I = x.I;
  const StepBuffers& b = x.b;
  const DecodeContextShard& ctx = I.context;
  const int64_t row = c.kv_lora_rank + c.qk_rope_head_dim, W = ctx.world;
  const size_t row_bytes = static_cast<size_t>(row) * sizeof(uint16_t);
  // This rank's rows of each sequence's context, sequence after sequence at rank 0's count apart (the most any rank
  // has), gathered by the layout over its own pages (its local token k of engine block b is row k mod page of page b).
  std::vector<KvGatherSeq> mine(x.prefill.size());
  int64_t sent = 0, longest = 1;
  for (size_t i = 0; i < x.prefill.size(); ++i) {
    const MlaPrefillSequence& s = x.prefill[i];
    const int64_t own = ctx.local_count(s.kv_len);
    mine[i] = KvGatherSeq{static_cast<int32_t>(s.table_row), static_cast<int32_t>(sent), static_cast<int32_t>(own), 0};
    sent += ctx.local_count(s.kv_len, 0);
    longest = std::max(longest, own);
  }
  if (sent != x.shape.context_rows || !b.ctx_rows_send)
    return internal_error("split context rows: the step was planned for " + std::to_string(x.shape.context_rows) +
                          " rows a rank, its prefilling sequences need " + std::to_string(sent));
  // Pageable memory: the copy has taken the table when it returns (prompt steps are never captured).
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(b.ctx_gather_seqs, mine.data(), mine.size() * sizeof(KvGatherSeq),
                                               cudaMemcpyHostToDevice, I.stream),
                               "split context rows: gather table"));
  KvGatherArgs g;
  g.pages = pages, g.block_tables = b.tables, g.max_blocks = x.shape.max_blocks;
  g.seqs = b.ctx_gather_seqs, g.num_seqs = static_cast<int64_t>(mine.size()), g.max_kv_len = longest;
  g.out = b.ctx_rows_send;
  KILN_RETURN_IF_ERROR(I.layout->gather(g, I.sdk_stream()).with_context("this rank's context rows"));
  KILN_RETURN_IF_ERROR(I.collective->all_gather(b.ctx_rows_send, b.ctx_rows_recv, sent * row, DType::kBF16,
                                                I.sdk_stream())
                           .with_context("context rows gather"));
  // Into position order: position p of a sequence is rank p mod W's local row p div W.
  int64_t key = 0, offset = 0;
  for (const MlaPrefillSequence& s : x.prefill) {
    for (int r = 0; r < W; ++r) {
      const int64_t count = ctx.local_count(s.kv_len, r);
      if (count == 0) continue;
      KILN_RETURN_IF_ERROR(cuda_ok(
          cudaMemcpy2DAsync(latent + (key + r) * row, W * row_bytes, b.ctx_rows_recv + (r * sent + offset) * row,
                            row_bytes, row_bytes, static_cast<size_t>(count), cudaMemcpyDeviceToDevice, I.stream),
          "split context rows: into position order"));
    }
    key += s.kv_len;
    offset += ctx.local_count(s.kv_len, 0);
  }
  return ok_status();
}

}  // namespace kiln::cuda
