#include <algorithm>
#include <limits>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_gate_gemv.h"
#include "kernels/cuda/moe_gate_route_group.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_route_group.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/skinny_gemm.h"
#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {

// y = down(silu(gate(x)) · up(x)) for a dense MLP / shared expert with fused gate_up. Batch-invariant steps run
// gate_up and SwiGLU as one skinny GEMM (one launch less, and no [N, 2·inter] round trip); larger ones cuBLAS
// into b.gu, then the SwiGLU kernel.
Status dense_mlp(const StepContext& x, const GpuLinear& gate_up, const GpuLinear& down, const uint16_t* in,
                 uint16_t* y) {
  CublasGemm& g = *x.I.gemm;
  const StreamHandle st = x.I.s();
  const int64_t N = x.shape.N, Hd = x.c.hidden_size, inter = down.in;
  if (N <= kSkinnyGemmMaxRows && skinny_gemm_supported(in, N, Hd, gate_up.w)) {
    KILN_RETURN_IF_ERROR(skinny_gemm_swiglu_bf16(in, N, Hd, gate_up.w, inter, x.b.act, st));
  } else {
    KILN_RETURN_IF_ERROR(g.linear(in, N, Hd, gate_up.w, 2 * inter, x.b.gu, DType::kBF16, st));
    KILN_RETURN_IF_ERROR(swiglu_bf16(x.b.gu, x.b.gu + inter, N, inter, 2 * inter, x.b.act, st));
  }
  return g.linear(x.b.act, N, inter, down.w, Hd, y, DType::kBF16, st);
}

// Whether the shared expert runs inside the routed-expert launches (MoeSharedExpert): it has the routed experts'
// shape (GLM-4.7-Flash: one expert of moe_intermediate_size) and the step takes the batch-invariant GEMV path.
// Else it runs as a dense MLP beside them.
bool shared_expert_folds(const StepContext& x, const GpuLayer& w) {
  const int64_t Hd = x.c.hidden_size, moe_I = x.c.moe_intermediate_size;
  return w.has_shared && x.shape.N <= kBatchInvariantMaxRows && w.gate_up.in == Hd && w.gate_up.out == 2 * moe_I &&
         w.down.in == moe_I && w.down.out == Hd;
}

}  // namespace

Status mlp_block(const StepContext& x, const GpuLayer& w, const NextNorm* next) {
  const ModelConfig& c = x.c;
  const StepBuffers& b = x.b;
  const StreamHandle st = x.I.s();
  StepTimer& timer = x.I.timer;
  if (!w.is_moe) {
    KILN_RETURN_IF_ERROR(dense_mlp(x, w.gate_up, w.down, b.h, b.y));
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
  // fused with routing and grouping: one launch, the same logits), larger ones cuBLAS.
  if (moe_gate_route_and_group_supported(b.h, N, Hd, w.router, rc)) {
    KILN_RETURN_IF_ERROR(moe_gate_route_and_group(b.h, N, Hd, w.router, b.router_logits, w.router_bias, rc,
                                                  b.route_ids, b.route_w, d, x.I.route_done, st)
                             .with_context("MoE router"));
  } else {
    if (N <= kBatchInvariantMaxRows) {
      KILN_RETURN_IF_ERROR(
          moe_gate_logits_bf16(b.h, N, Hd, w.router, E, b.router_logits, st).with_context("MoE router"));
    } else {
      KILN_RETURN_IF_ERROR(bf16_to_f32(b.h, N * Hd, b.h32, st));
      KILN_RETURN_IF_ERROR(blas_ok(cublasSgemm(x.I.blas, CUBLAS_OP_T, CUBLAS_OP_N, E, N, Hd, &one, w.router, Hd,
                                               b.h32, Hd, &zero, b.router_logits, E),
                                   "MoE router"));
    }
    KILN_RETURN_IF_ERROR(moe_route_and_group(b.router_logits, w.router_bias, N, rc, b.route_ids, b.route_w, d, st));
  }
  timer.mark("MoE: router + grouping");
  const int64_t moe_I = c.moe_intermediate_size;
  const float no_limit = std::numeric_limits<float>::infinity();
  // A folded shared expert's act goes to b.act, its fp32 output to the N rows of b.moe_y after the routed pairs'.
  const MoeSharedExpert folded{w.gate_up.w, w.down.w, N, b.act, b.moe_y + N * topk * Hd};
  const MoeSharedExpert* shared = shared_expert_folds(x, w) ? &folded : nullptr;
  if (N > kBatchInvariantMaxRows && moe_prefers_grouped_gemm(N * topk, E)) {
    // Prompt-sized steps: tens of rows per expert, so tensor-core tiles beat streaming each weight row. Not in
    // batch-invariant steps (a pair's sums would depend on how many pairs its expert gets); at GLM-4.7-Flash's
    // 64 experts and top-4 the grouped GEMM starts at 64 tokens anyway.
    KILN_RETURN_IF_ERROR(moe_gate_up_swiglu_grouped_bf16(b.h, N, topk, Hd, moe_I, w.experts_gate_up, E, d, no_limit,
                                                         b.moe_h, st));
    KILN_RETURN_IF_ERROR(moe_down_grouped_bf16(b.moe_h, N * topk, moe_I, Hd, w.experts_down, E, d, b.route_w, b.moe_y, st));
  } else {
    KILN_RETURN_IF_ERROR(moe_gate_up_swiglu_bf16(b.h, N, topk, Hd, moe_I, w.experts_gate_up, E, d, no_limit, b.moe_h,
                                                 st, shared));
    KILN_RETURN_IF_ERROR(
        moe_down_bf16(b.moe_h, N * topk, moe_I, Hd, w.experts_down, E, d, b.route_w, b.moe_y, st, shared));
  }
  timer.mark("MoE: routed experts");  // with the folded shared expert
  if (w.has_shared && !shared) KILN_RETURN_IF_ERROR(dense_mlp(x, w.gate_up, w.down, b.h, b.shared));
  const uint16_t* add = w.has_shared && !shared ? b.shared : nullptr;
  const float* shared_y = shared ? shared->y : nullptr;
  if (next)
    KILN_RETURN_IF_ERROR(moe_combine_add_rmsnorm_bf16(b.moe_y, N, topk, Hd, add, shared_y, b.resid, next->weight,
                                                      next->eps, next->out, st));
  else
    KILN_RETURN_IF_ERROR(moe_combine_bf16(b.moe_y, N, topk, Hd, add, b.y, st, shared_y));
  timer.mark(next ? "MoE: shared expert + combine + next RMSNorm" : "MoE: shared expert + combine");
  return ok_status();
}

}  // namespace kiln::cuda
