#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/norm.h"
#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/mla_rope_cache_write.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {

// The per-head absorption products of a batch-invariant step run the skinny GEMM as a strided batch over heads
// (cuBLAS's batched GEMM picks its algorithm by the row count); it needs 16-byte aligned rows.
bool absorbs_with_skinny_gemm(const ModelConfig& c, int64_t rows) {
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  return rows <= kBatchInvariantMaxRows && qk % 8 == 0 && c.qk_nope_head_dim % 8 == 0 && c.kv_lora_rank % 8 == 0;
}

}  // namespace

// Decode-shaped rows attend in absorbed form over the paged bf16 latent cache: queries move into latent space
// through W_UK, attend there, and come back out through W_UV. Rows of prefilling sequences (x.prefill) are then
// overwritten by the expanded-form prefill kernel, which is far cheaper per (query, key) pair.
Status attention_block(const StepContext& x, const GpuLayer& w, uint16_t* pages, float* index_keys) {
  const ModelConfig& c = x.c;
  CudaMlaMoeModel::Impl& I = x.I;
  const StepBuffers& b = x.b;
  const StreamHandle st = I.s();
  CublasGemm& g = *I.gemm;
  const int64_t N = x.shape.N, Hd = c.hidden_size, H = c.num_attention_heads, L = c.kv_lora_rank;
  const int64_t Rr = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, vd = c.v_head_dim, qk = nope + Rr, D = L + Rr;
  const float one = 1.0f, zero = 0.0f;
  // q_a and kv_a in one GEMM (fp32 out); the q_a norm rounds its input to bf16 as if q_a had stored bf16.
  const int64_t q_lora = w.qkv_a.w ? c.q_lora_rank : 0, qkv = q_lora + D;
  float* ckv = b.qkv_a + q_lora;
  if (w.qkv_a.w) {
    KILN_RETURN_IF_ERROR(g.linear(b.h, N, Hd, w.qkv_a.w, qkv, b.qkv_a, DType::kF32, st));
    KILN_RETURN_IF_ERROR(
        rmsnorm_rounded_f32_bf16(b.qkv_a, qkv, w.q_a_norm, N, q_lora, kLatentNormEps, b.q_res_n, st));
    KILN_RETURN_IF_ERROR(g.linear(b.q_res_n, N, q_lora, w.q_b.w, H * qk, b.q, DType::kF32, st));
  } else {
    KILN_RETURN_IF_ERROR(g.linear(b.h, N, Hd, w.q_proj.w, H * qk, b.q, DType::kF32, st));
    KILN_RETURN_IF_ERROR(g.linear(b.h, N, Hd, w.kv_a.w, D, b.qkv_a, DType::kF32, st));
  }
  // RoPE, the cache write, q in bf16 for the absorption and q_pe into the absorbed queries: one launch.
  MlaRopeCacheWrite rw;
  rw.q = b.q, rw.ckv = ckv, rw.ckv_stride = qkv, rw.n = N, rw.heads = H, rw.nope = nope, rw.rope = Rr, rw.latent = L;
  rw.positions = b.positions, rw.inv_freq = I.inv_freq, rw.attention_factor = I.rope_factor;
  rw.norm_weight = w.kv_a_norm, rw.eps = kLatentNormEps, rw.slots = b.slots, rw.cache = pages;
  rw.q_bf = b.q_bf, rw.q_abs = b.q_abs;
  KILN_RETURN_IF_ERROR(mla_rope_cache_write(rw, st));
  I.timer.mark("attention: projections, rope, cache write");
  if (w.has_indexer) {
    KILN_RETURN_IF_ERROR(indexer_block(x, w.indexer, index_keys));
    I.timer.mark("attention: DSA indexer");
  }
  // Absorption: q_lat[t, h] = W_UK[h]ᵀ · q_nope[t, h], one GEMM per head (strided batch over kv_b's heads).
  const bool skinny = absorbs_with_skinny_gemm(c, N);
  if (skinny) {
    SkinnyStrides s;
    s.batches = H, s.x_row = H * qk, s.x_batch = qk, s.w_batch = L * nope, s.y_row = H * D, s.y_batch = D;
    KILN_RETURN_IF_ERROR(
        skinny_gemm_strided_batched_bf16(b.q_bf, N, nope, w.w_uk_t, L, b.q_abs, DType::kF32, s, false, I.sm_count, st)
            .with_context("MLA query absorption"));
  } else {
    KILN_RETURN_IF_ERROR(blas_ok(
      cublasGemmStridedBatchedEx(I.blas, CUBLAS_OP_N, CUBLAS_OP_N, L, N, nope, &one, w.kv_b.w, CUDA_R_16BF, L,
                                 (nope + vd) * L, b.q_bf, CUDA_R_16BF, H * qk, qk, &zero, b.q_abs, CUDA_R_32F, H * D, D,
                                 H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "MLA query absorption"));
  }
  I.timer.mark("attention: query absorption");
  const float scale = static_cast<float>(c.attention_scale());
  if (x.shape.fast_attention) {
    MlaDecodeParams p;
    p.q = b.q_abs, p.num_queries = N, p.num_heads = H, p.cache = pages, p.block_size = x.block_size;
    p.block_tables = b.tables, p.max_blocks = x.shape.max_blocks, p.query_seq = b.query_seq, p.kv_len = b.kv_len;
    // The kernel's last writer stores o_lat in bf16 for the un-absorption, so no cast launch follows.
    p.scale = scale, p.out_bf16 = b.o_lat_bf, p.num_splits = x.shape.splits, p.workspace = b.mla_workspace;
    p.split_by_length = x.shape.split_by_length;
    KILN_RETURN_IF_ERROR(mla_decode_bf16(p, st));
  } else {
    MlaReferenceParams p;
    p.q = b.q_abs, p.rows = N, p.heads = H, p.latent_dim = L, p.rope_dim = Rr, p.cache = pages, p.block_size = x.block_size;
    p.block_tables = b.tables, p.max_blocks = x.shape.max_blocks, p.query_seq = b.query_seq, p.kv_len = b.kv_len;
    p.max_kv_len = x.shape.attn_width, p.scale = scale, p.scores = b.scores, p.out = b.o_lat;
    // A DSA model always attends through the selection, as the CPU model does (all visible keys while they
    // number at most index_topk).
    p.selected = b.selected, p.selected_width = b.selected ? c.index_topk : 0;
    KILN_RETURN_IF_ERROR(mla_attention_reference(p, st));
    KILN_RETURN_IF_ERROR(f32_to_bf16(b.o_lat, N * H * L, b.o_lat_bf, st));
  }
  I.timer.mark("attention: MLA decode kernel");
  // Back out of latent space: attn[t, h] = W_UV[h] · o_lat[t, h].
  if (skinny) {
    SkinnyStrides s;
    s.batches = H, s.x_row = H * L, s.x_batch = L, s.w_batch = (nope + vd) * L, s.y_row = H * vd, s.y_batch = vd;
    KILN_RETURN_IF_ERROR(skinny_gemm_strided_batched_bf16(b.o_lat_bf, N, L, w.kv_b.w + nope * L, vd, b.attn,
                                                          DType::kBF16, s, false, I.sm_count, st)
                             .with_context("MLA output un-absorption"));
  } else {
    KILN_RETURN_IF_ERROR(blas_ok(
      cublasGemmStridedBatchedEx(I.blas, CUBLAS_OP_T, CUBLAS_OP_N, vd, N, L, &one, w.kv_b.w + nope * L, CUDA_R_16BF,
                                 L, (nope + vd) * L, b.o_lat_bf, CUDA_R_16BF, H * L, L, &zero, b.attn, CUDA_R_16BF,
                                 H * vd, vd, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "MLA output un-absorption"));
  }
  I.timer.mark("attention: un-absorption");
  if (!x.prefill.empty()) {
    MlaPrefillArgs p;
    p.seqs = x.prefill;
    p.dims = {H, nope, Rr, vd, L};
    p.q = b.q, p.pages = pages, p.block_size = x.block_size, p.block_tables = b.tables, p.max_blocks = x.shape.max_blocks;
    p.kv_b = w.kv_b.w, p.scale = scale, p.out = b.attn;
    p.workspace = b.prefill_workspace, p.workspace_bytes = x.shape.prefill_workspace;
    KILN_RETURN_IF_ERROR(mla_prefill_attention(p, I.blas, st));
    I.timer.mark("attention: prefill kernel (expanded form)");
  }
  KILN_RETURN_IF_ERROR(g.linear(b.attn, N, H * vd, w.o_proj.w, Hd, b.y, DType::kBF16, st));
  I.timer.mark("attention: o_proj");
  return ok_status();
}

}  // namespace kiln::cuda
