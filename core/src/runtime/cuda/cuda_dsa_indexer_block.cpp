#include <cmath>

#include "kernels/cuda/rope.h"
#include "kernels/cuda/topk.h"
#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/indexer_key_fp8_kernels.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {
// The indexer's key LayerNorm (nn.LayerNorm(head_dim, eps=1e-6) in HF), as the CPU model.
constexpr float kIndexerNormEps = 1e-6f;
}  // namespace

// MlaMoeModel::indexer_select on the GPU: q from the normed q_a output, k from the layer input, both roped on
// their first qk_rope_head_dim values (interleaved); scores over every visible key; top index_topk per row.
Status indexer_block(const StepContext& x, const GpuIndexer& w, void* index_keys) {
  const ModelConfig& c = x.c;
  CudaMlaMoeModel::Impl& I = x.I;
  const StepBuffers& b = x.b;
  const StreamHandle st = I.s();
  const int64_t N = x.shape.N, Hi = c.index_n_heads, D = c.index_head_dim;
  const int64_t Rr = c.qk_rope_head_dim;
  if (!index_keys) return failed_precondition("the GPU KV pool has no indexer key cache for a DSA layer");
  KILN_RETURN_IF_ERROR(run_linear(x, *w.wq_b, b.q_res_n, N, b.idx_q, DType::kF32));
  KILN_RETURN_IF_ERROR(run_linear(x, *w.wk, b.h, N, b.idx_k, DType::kF32));
  KILN_RETURN_IF_ERROR(run_linear(x, *w.weights_proj, b.h, N, b.idx_w, DType::kF32));
  KILN_RETURN_IF_ERROR(layernorm_f32(b.idx_k, w.k_norm_weight, w.k_norm_bias, N, D, kIndexerNormEps, b.idx_k, st));
  if (Rr > 0) {
    KILN_RETURN_IF_ERROR(
        apply_rope_interleaved_f32(b.idx_q, N, Hi, Hi * D, D, b.positions, I.inv_freq, I.rope_factor, Rr, st));
    KILN_RETURN_IF_ERROR(apply_rope_interleaved_f32(b.idx_k, N, 1, D, D, b.positions, I.inv_freq, I.rope_factor, Rr, st));
  }
  // The keys in the layout's format: fp32 rows, or quantized here to e4m3 + scale (the host codec's bytes).
  const IndexerKeyFormat key_format = I.layout->indexer_key_format();
  if (key_format == IndexerKeyFormat::kFp8E4m3Scaled)
    KILN_RETURN_IF_ERROR(indexer_keys_append_fp8(b.idx_k, N, D, b.slots, static_cast<uint8_t*>(index_keys), st));
  else
    KILN_RETURN_IF_ERROR(scatter_rows_f32(b.idx_k, N, D, b.slots, static_cast<float*>(index_keys), st));
  DsaIndexerParams p;
  p.q = b.idx_q, p.w = b.idx_w, p.rows = N, p.heads = Hi, p.dim = D;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D)), p.head_scale = 1.0f / std::sqrt(static_cast<float>(Hi));
  p.keys = index_keys, p.key_format = key_format, p.block_size = x.block_size, p.block_tables = b.tables, p.max_blocks = x.shape.max_blocks;
  p.query_seq = b.query_seq, p.kv_len = b.kv_len, p.width = x.shape.scores_kv, p.scores = b.idx_scores;
  KILN_RETURN_IF_ERROR(dsa_indexer_scores_paged(p, st));
  // Keys past a row's kv_len score −inf; they may fill the selection's tail when fewer keys are visible than
  // index_topk, and attention skips them like the −1 padding.
  return topk_rows(b.idx_scores, N, x.shape.scores_kv, c.index_topk, -1, b.selected, st);
}

}  // namespace kiln::cuda
