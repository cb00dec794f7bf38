#include <cstdlib>
#include <string_view>

#include "kernels/cuda/norm.h"
#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/mla_rope_cache_write.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
bool env_is(const char* name, std::string_view value) {
  const char* e = std::getenv(name);
  return e && std::string_view(e) == value;
}

namespace {
bool queries_forced_f32() {
  static const bool forced = env_is("KILN_MLA_QUERIES", "f32");
  return forced;
}
}  // namespace

Status run_linear(const StepContext& x, const Linear& l, const void* in, int64_t n, void* out, DType out_dtype) {
  LinearRun r;
  r.x = TensorView::contiguous(const_cast<void*>(in), DType::kBF16, {n, l.in_features()}, x.I.dev.device());
  r.y = TensorView::contiguous(out, out_dtype, {n, l.out_features()}, x.I.dev.device());
  return l.run(r, x.I.sdk_stream());
}

// Decode-shaped rows attend in absorbed form through the KV layout: queries move into latent space through W_UK,
// attend there over the layout's pages, and come back out through W_UV. Rows of prefilling sequences (x.prefill) are
// then overwritten by the expanded-form prefill kernel (over the layout's gathered rows), which is far cheaper per
// (query, key) pair; a step of prefilling rows only skips the absorbed pass.
Status attention_block(const StepContext& x, const GpuLayer& w, void* pages, void* index_keys) {
  const ModelConfig& c = x.c;
  CudaMlaMoeModel::Impl& I = x.I;
  const KvLayout& layout = *I.layout;
  const StepBuffers& b = x.b;
  const StreamHandle st = I.s();
  // H: this rank's heads (all of them on one rank); their outputs are gathered for o_proj, which reads every head's.
  const int64_t N = x.shape.N, H = x.shape.shard.count(c.num_attention_heads), L = c.kv_lora_rank;
  uint16_t* const attn = I.sharded() ? b.attn_local : b.attn;
  const int64_t Rr = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, vd = c.v_head_dim, qk = nope + Rr, D = L + Rr;
  const float one = 1.0f, zero = 0.0f;
  if (!pages) return failed_precondition("the layer has no KV pages");
  // q_a and kv_a in one launch (fp32 out); the q_a norm rounds its input to bf16 as if q_a had stored bf16.
  const int64_t q_lora = w.qkv_a ? c.q_lora_rank : 0, qkv = q_lora + D;
  float* ckv = b.qkv_a + q_lora;
  if (w.qkv_a) {
    KILN_RETURN_IF_ERROR(run_linear(x, *w.qkv_a, b.h, N, b.qkv_a, DType::kF32));
    KILN_RETURN_IF_ERROR(
        rmsnorm_rounded_f32_bf16(b.qkv_a, qkv, w.q_a_norm, N, q_lora, w.latent_norm_eps, b.q_res_n, st));
    KILN_RETURN_IF_ERROR(run_linear(x, *w.q_b, b.q_res_n, N, b.q, DType::kF32));
  } else {
    KILN_RETURN_IF_ERROR(run_linear(x, *w.q_proj, b.h, N, b.q, DType::kF32));
    KILN_RETURN_IF_ERROR(run_linear(x, *w.kv_a, b.h, N, b.qkv_a, DType::kF32));
  }
  // A step whose every row prefills (a lone prompt's chunk) gets all its attention from the prefill kernel below:
  // the absorbed pass would only be overwritten (at 4K tokens it was 16 % of the prompt's GPU time on an H100). With
  // split context the ranks' absorbed passes meet in collectives, so those steps keep it.
  int64_t prefill_rows = 0;
  for (const MlaPrefillSequence& s : x.prefill) prefill_rows += s.q_len;
  const bool absorbed = prefill_rows < N || I.context.split();
  // RoPE, the KV append, q in bf16 for the absorption and q_pe into the absorbed queries: one launch where the layout
  // fuses it all; else the core finishes the rows and queries first and the layout stores final rows.
  KvAppendArgs append;
  append.pages = pages, append.slots = b.slots, append.n = N, append.rows = ckv, append.row_stride = qkv;
  append.norm_weight = w.kv_a_norm, append.eps = w.latent_norm_eps;
  append.positions = Rr > 0 ? b.positions : nullptr, append.inv_freq = I.inv_freq, append.rope_factor = I.rope_factor;
  append.q = b.q, append.heads = H, append.nope = nope, append.q_bf = b.q_bf, append.q_abs = b.q_abs;
  const uint32_t fused = layout.append_fusions();
  // A step that attends in the expanded prefill form alone reads the queries in bf16 only: where the layout takes
  // it, no fp32 roped q and no absorbed q_pe are written (KILN_MLA_QUERIES=f32 keeps them: an A/B switch).
  const bool bf16_queries_only = !absorbed && !queries_forced_f32();
  if ((fused & kKvFuseNormRope) && (fused & kKvFuseQueries)) {
    if (bf16_queries_only && (fused & kKvFuseQueriesBf16Only)) append.q_abs = nullptr;
    KILN_RETURN_IF_ERROR(layout.append(append, I.sdk_stream()).with_context("KV append"));
  } else {
    MlaRopeCacheWrite rw;
    rw.q = b.q, rw.ckv = ckv, rw.ckv_stride = qkv, rw.n = N, rw.heads = H, rw.nope = nope, rw.rope = Rr, rw.latent = L;
    rw.positions = append.positions, rw.inv_freq = I.inv_freq, rw.attention_factor = I.rope_factor;
    rw.norm_weight = w.kv_a_norm, rw.eps = w.latent_norm_eps, rw.slots = b.slots, rw.cache = nullptr;
    rw.q_bf = b.q_bf, rw.q_abs = b.q_abs;
    if (bf16_queries_only) rw.q_abs = nullptr;
    KILN_RETURN_IF_ERROR(mla_rope_cache_write(rw, st));
    append.norm_weight = nullptr, append.positions = nullptr, append.q = nullptr;
    KILN_RETURN_IF_ERROR(layout.append(append, I.sdk_stream()).with_context("KV append"));
  }
  I.timer.mark("attention: projections, rope, cache write");
  if (w.indexer) {
    KILN_RETURN_IF_ERROR(indexer_block(x, *w.indexer, index_keys));
    I.timer.mark("attention: DSA indexer");
  } else if (x.select) {
    KILN_RETURN_IF_ERROR((*x.select)());  // the architecture's own selection (b.q_res_n is ready)
    I.timer.mark("attention: DSA indexer");
  }
  // Absorption: q_lat[t, h] = W_UK[h]ᵀ · q_nope[t, h], one GEMM per head (strided batch over kv_b's heads).
  const bool skinny = absorbs_with_skinny_gemm(c, N);
  if (absorbed && skinny) {
    SkinnyStrides s;
    s.batches = H, s.x_row = H * qk, s.x_batch = qk, s.w_batch = L * nope, s.y_row = H * D, s.y_batch = D;
    KILN_RETURN_IF_ERROR(
        skinny_gemm_strided_batched_bf16(b.q_bf, N, nope, w.w_uk_t, L, b.q_abs, DType::kF32, s, false, I.sm_count, st)
            .with_context("MLA query absorption"));
  } else if (absorbed) {
    KILN_RETURN_IF_ERROR(blas_ok(
      cublasGemmStridedBatchedEx(I.blas, CUBLAS_OP_N, CUBLAS_OP_N, L, N, nope, &one, w.kv_b_dense, CUDA_R_16BF, L,
                                 (nope + vd) * L, b.q_bf, CUDA_R_16BF, H * qk, qk, &zero, b.q_abs, CUDA_R_32F, H * D, D,
                                 H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "MLA query absorption"));
  }
  I.timer.mark("attention: query absorption");
  const float scale = static_cast<float>(c.attention_scale());
  if (I.context.split()) {
    KILN_RETURN_IF_ERROR(split_context_attend(x, pages, scale).with_context("MLA attention (split context)"));
  } else if (absorbed) {
    MlaAttendArgs a;
    a.cache = pages, a.num_queries = N, a.num_heads = H, a.q = b.q_abs;
    a.block_tables = b.tables, a.max_blocks = x.shape.max_blocks, a.query_seq = b.query_seq, a.kv_len = b.kv_len;
    // A DSA model always attends through the selection, as the CPU model does (all visible keys while they number at
    // most index_topk).
    a.selected = b.selected, a.selected_width = b.selected ? c.index_topk : 0;
    a.scale = scale;
    a.out_bf16 = b.o_lat_bf;  // what the un-absorption reads
    a.max_kv_len = x.shape.attend_shape.max_kv_len;
    a.num_splits = x.shape.attend.num_splits, a.split_by_length = x.shape.attend.split_by_length;
    a.workspace = b.mla_workspace, a.workspace_bytes = x.shape.attend.workspace_bytes;
    KILN_RETURN_IF_ERROR(layout.attend(a, I.sdk_stream()).with_context("MLA attention"));
  }
  I.timer.mark("attention: MLA decode kernel");
  // Back out of latent space: attn[t, h] = W_UV[h] · o_lat[t, h].
  if (absorbed && skinny) {
    SkinnyStrides s;
    s.batches = H, s.x_row = H * L, s.x_batch = L, s.w_batch = (nope + vd) * L, s.y_row = H * vd, s.y_batch = vd;
    KILN_RETURN_IF_ERROR(skinny_gemm_strided_batched_bf16(b.o_lat_bf, N, L, w.kv_b_dense + nope * L, vd, attn,
                                                          DType::kBF16, s, false, I.sm_count, st)
                             .with_context("MLA output un-absorption"));
  } else if (absorbed) {
    KILN_RETURN_IF_ERROR(blas_ok(
      cublasGemmStridedBatchedEx(I.blas, CUBLAS_OP_T, CUBLAS_OP_N, vd, N, L, &one, w.kv_b_dense + nope * L, CUDA_R_16BF,
                                 L, (nope + vd) * L, b.o_lat_bf, CUDA_R_16BF, H * L, L, &zero, attn, CUDA_R_16BF,
                                 H * vd, vd, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "MLA output un-absorption"));
  }
  I.timer.mark("attention: un-absorption");
  if (!x.prefill.empty()) {
    MlaPrefillArgs p;
    p.seqs = x.prefill;
    p.dims = {H, nope, Rr, vd, L};
    p.q = b.q_bf, p.layout = &layout, p.pages = pages, p.stream = I.sdk_stream(), p.block_size = x.block_size;
    p.block_tables = b.tables, p.max_blocks = x.shape.max_blocks;
    p.kv_b = w.kv_b_dense, p.scale = scale, p.out = attn;
    p.workspace = b.prefill_workspace, p.workspace_bytes = x.shape.prefill_workspace;
    p.key_capacity = x.prefill_key_capacity, p.keys_ready = x.prefill_keys_ready;  // layer-major prefill's tiles
    if (I.context.split()) p.gather_rows = [&](uint16_t* latent) { return split_context_rows(x, pages, latent); };
    KILN_RETURN_IF_ERROR(mla_prefill_attention(p, I.blas, st));
    I.timer.mark("attention: prefill kernel (expanded form)");
  }
  if (I.sharded()) {
    KILN_RETURN_IF_ERROR(gather_units(x, attn, N, c.num_attention_heads, vd, DType::kBF16, b.attn));
    I.timer.mark("attention: head gather (tensor parallel)");
  }
  KILN_RETURN_IF_ERROR(run_linear(x, *w.o_proj, b.attn, N, b.y, DType::kBF16));
  I.timer.mark("attention: o_proj");
  return ok_status();
}

}  // namespace kiln::cuda
