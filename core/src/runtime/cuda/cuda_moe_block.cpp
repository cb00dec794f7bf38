#include <algorithm>
#include <limits>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/moe_gate_gemv.h"
#include "kernels/cuda/moe_gate_terms.h"
#include "kernels/cuda/moe_gate_route_group.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_route_group.h"
#include "kernels/cuda/norm.h"
#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {

// y = down(silu(gate(x)) · up(x)) for a dense MLP / shared expert with fused gate_up: the format's Linear takes the
// SwiGLU as its epilogue when it can (the built-in one: one skinny GEMM in batch-invariant steps, no [N, 2·inter]
// round trip; cuBLAS into b.gu, then the SwiGLU kernel, past them), else the core applies it. With `gathered`
// (tensor parallelism: gate_up holds this rank's columns of down's input), the SwiGLU columns of every rank are
// gathered before down, which reads all of them.
Status dense_mlp(const StepContext& x, const Linear& gate_up, const Linear& down, const uint16_t* in, uint16_t* y,
                 float limit, bool gathered = false) {
  const StreamHandle st = x.I.s();
  const int64_t N = x.shape.N, inter = gate_up.out_features() / 2;
  uint16_t* const act = gathered ? x.b.act_local : x.b.act;
  if (gate_up.supports(Epilogue::kSwiGLU)) {
    LinearRun r;
    r.x = TensorView::contiguous(const_cast<uint16_t*>(in), DType::kBF16, {N, gate_up.in_features()}, x.I.dev.device());
    r.y = TensorView::contiguous(act, DType::kBF16, {N, inter}, x.I.dev.device());
    r.epilogue = Epilogue::kSwiGLU;
    r.swiglu_limit = limit;
    r.workspace = x.b.gu;
    r.workspace_bytes = static_cast<size_t>(N * gate_up.out_features()) * 2;
    KILN_RETURN_IF_ERROR(gate_up.run(r, x.I.sdk_stream()));
  } else {
    KILN_RETURN_IF_ERROR(run_linear(x, gate_up, in, N, x.b.gu, DType::kBF16));
    KILN_RETURN_IF_ERROR(swiglu_bf16(x.b.gu, x.b.gu + inter, N, inter, 2 * inter, act, st, limit));
  }
  if (gathered) KILN_RETURN_IF_ERROR(gather_units(x, act, N, down.in_features(), 1, DType::kBF16, x.b.act));
  return run_linear(x, down, x.b.act, N, y, DType::kBF16);
}

bool gate_forced_f32() {
  static const bool forced = env_is("KILN_MOE_GATE", "f32");
  return forced;
}

}  // namespace

Status mlp_block(const StepContext& x, const GpuLayer& w, const NextNorm* next) {
  const ModelConfig& c = x.c;
  const StepBuffers& b = x.b;
  const StreamHandle st = x.I.s();
  StepTimer& timer = x.I.timer;
  if (!w.is_moe) {
    KILN_RETURN_IF_ERROR(dense_mlp(x, *w.gate_up, *w.down, b.h, b.y, w.swiglu_limit, x.I.sharded()));
    timer.mark("dense MLP");
    if (next) {
      KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, next->weight, x.shape.N, c.hidden_size, next->eps,
                                            next->out, st));
      timer.mark("residual add + RMSNorm");
    }
    return ok_status();
  }
  const int64_t N = x.shape.N, Hd = c.hidden_size;
  const int64_t E = std::max<int64_t>(c.n_routed_experts, 1), topk = std::max<int64_t>(c.num_experts_per_tok, 1);
  const float one = 1.0f, zero = 0.0f;
  const cpu::MoeRouterConfig rc = moe_router_config(c);
  const MoeDispatch d{b.offsets, b.active, b.order};
  // The gate in fp32, as the CPU model runs it: batch-invariant steps through the gate GEMV (up to 16 tokens
  // fused with routing and grouping: one launch, the same logits), larger ones on the tensor cores from the router's
  // exact bf16 terms, or (no terms, or KILN_MOE_GATE=f32 for an A/B) widened to fp32 for cuBLAS's fp32 GEMM.
  if (moe_gate_route_and_group_supported(b.h, N, Hd, w.router, rc)) {
    KILN_RETURN_IF_ERROR(moe_gate_route_and_group(b.h, N, Hd, w.router, b.router_logits, w.router_bias, rc,
                                                  b.route_ids, b.route_w, d, x.I.route_done, st)
                             .with_context("MoE router"));
  } else {
    if (N <= kBatchInvariantMaxRows) {
      KILN_RETURN_IF_ERROR(
          moe_gate_logits_bf16(b.h, N, Hd, w.router, E, b.router_logits, st).with_context("MoE router"));
    } else if (w.router_terms > 0 && w.router_terms * E <= Hd && !gate_forced_f32()) {
      // On the tensor cores from the router's exact bf16 terms (moe_gate_terms.h); h32 holds the terms' logits.
      KILN_RETURN_IF_ERROR(moe_gate_logits_bf16_terms(x.I.blas, b.h, N, Hd, w.router_bf16_terms, w.router_terms, E,
                                                      b.h32, b.router_logits, st)
                               .with_context("MoE router"));
    } else {
      KILN_RETURN_IF_ERROR(bf16_to_f32(b.h, N * Hd, b.h32, st));
      KILN_RETURN_IF_ERROR(blas_ok(cublasSgemm(x.I.blas, CUBLAS_OP_T, CUBLAS_OP_N, E, N, Hd, &one, w.router, Hd,
                                               b.h32, Hd, &zero, b.router_logits, E),
                                   "MoE router"));
    }
    KILN_RETURN_IF_ERROR(moe_route_and_group(b.router_logits, w.router_bias, N, rc, b.route_ids, b.route_w, d, st));
  }
  // Tensor parallelism: every rank routed every token alike; each runs the pairs of its own experts (renumbered
  // from 0, the others' ids out of range and left out of the grouping) into zeroed pair rows, and holds the shared
  // expert whole or not at all (gpu_weights.h), so summing the rows over the ranks gives each its one owner's value.
  const bool sharded = x.I.sharded();
  const bool model_has_shared = c.n_shared_experts > 0;
  const int32_t* ids = b.route_ids;
  if (sharded) {
    const int64_t local = x.shape.shard.count(E);
    KILN_RETURN_IF_ERROR(offset_ids_i32(b.route_ids, N * topk, static_cast<int32_t>(x.shape.shard.begin(E)),
                                        b.pair_ids_local, st));
    KILN_RETURN_IF_ERROR(moe_group_by_expert(b.pair_ids_local, N * topk, local, d, st).with_context("MoE rank grouping"));
    ids = b.pair_ids_local;
    KILN_RETURN_IF_ERROR(cuda_ok(
        cudaMemsetAsync(b.moe_y, 0, static_cast<size_t>(N * (topk + (model_has_shared ? 1 : 0)) * Hd) * sizeof(float),
                        x.I.stream),
        "MoE pair rows"));
  }
  timer.mark("MoE: router + grouping");
  // The routed experts through the weight format; a shared expert may ride in their launches (its fp32 output
  // then lands in the N rows of b.moe_y after the routed pairs', and the combine rounds it to bf16 where dense_mlp
  // stores a shared expert run apart: both paths, and the CPU model's bf16 precision, round at the same point).
  ExpertRun run;
  run.x = TensorView::contiguous(b.h, DType::kBF16, {N, Hd}, x.I.dev.device());
  run.routing.top_k = static_cast<int>(topk);
  run.routing.ids = ids, run.routing.weights = b.route_w;
  run.routing.offsets = b.offsets, run.routing.active = b.active, run.routing.order = b.order;
  run.pair_out = b.moe_y;
  run.swiglu_limit = w.swiglu_limit;
  if (w.has_shared) {
    run.shared_gate_up = w.gate_up.get(), run.shared_down = w.down.get();
    run.shared_out = b.moe_y + N * topk * Hd;
  }
  run.workspace = b.expert_workspace, run.workspace_bytes = x.shape.expert_workspace;
  KILN_ASSIGN_OR_RETURN(const bool folded, w.experts->run(run, x.I.sdk_stream()));
  timer.mark("MoE: routed experts");  // with the folded shared expert
  if (w.has_shared && !folded) KILN_RETURN_IF_ERROR(dense_mlp(x, *w.gate_up, *w.down, b.h, b.shared, w.swiglu_limit));
  const uint16_t* add = w.has_shared && !folded ? b.shared : nullptr;
  const float* shared_y = folded ? run.shared_out : nullptr;
  if (sharded) {
    // The shared expert's rank may have folded it (fp32 rows after the pairs) or not (bf16 b.shared): the latter
    // goes into those rows widened, which the combine adds exactly as it adds `add` (in fp32, after the pairs).
    float* const shared_rows = b.moe_y + N * topk * Hd;
    if (add) KILN_RETURN_IF_ERROR(bf16_to_f32(add, N * Hd, shared_rows, st));
    if (next) {
      // The collective may sum and combine in one launch (transport-nccl's custom all-reduce, decode-sized steps):
      // the same row body as moe_combine_add_rmsnorm_bf16 over the same sums, so the same bits.
      MoeCombineNorm fused;
      fused.y = b.moe_y, fused.n = N, fused.top_k = topk, fused.hidden = Hd, fused.shared = model_has_shared;
      fused.residual = b.resid, fused.norm_weight = next->weight, fused.eps = next->eps, fused.normed = next->out;
      KILN_ASSIGN_OR_RETURN(const bool done, x.I.collective->all_reduce_moe_combine_norm(fused, x.I.sdk_stream()));
      if (done) {
        timer.mark("MoE: tensor-parallel sum + combine + next RMSNorm (one launch)");
        return ok_status();
      }
    }
    KILN_RETURN_IF_ERROR(sum_exclusive(x, b.moe_y, (N * topk + (model_has_shared ? N : 0)) * Hd, DType::kF32));
    add = nullptr;
    shared_y = model_has_shared ? shared_rows : nullptr;
  }
  if (next)
    KILN_RETURN_IF_ERROR(moe_combine_add_rmsnorm_bf16(b.moe_y, N, topk, Hd, add, shared_y, b.resid, next->weight,
                                                      next->eps, next->out, st));
  else
    KILN_RETURN_IF_ERROR(moe_combine_bf16(b.moe_y, N, topk, Hd, add, b.y, st, shared_y));
  timer.mark(next ? "MoE: shared expert + combine + next RMSNorm" : "MoE: shared expert + combine");
  return ok_status();
}

}  // namespace kiln::cuda
