// The Hopper form of the grouped expert GEMMs (moe_grouped_gemm.h's contract, same outputs): warpgroup MMA (wgmma,
// sm_90a) from 128-byte-swizzled shared memory. Per CTA 128 rows of one expert × 256 weight rows (gate_up: 128 gate
// and the matching 128 up rows → 128 h columns; down: 256 output columns); a producer warpgroup streams the weight
// tiles with TMA and gathers the rows (x through pair_order, or h in grouped order) with cp.async into a four-deep
// ring; two consumer warpgroups of 64 rows each run m64n256k16 products, each k tile's slot handed back as soon as
// its products have finished. A tile of at most 64 rows (an expert's last, or a small expert's only one) is split by
// weight rows instead: both warpgroups multiply A's 64 rows by half of the weight rows each (two m64n64 products).
//
// A producer thread's row copies are cp.async (a gather: no tensor map can follow pair_order); the tensor cores read
// shared memory through the async proxy, so the thread waits for its copies of a stage, fences and only then arrives
// on the stage's barrier — `lag` stages after issuing it, so that many stages of copies stay in flight behind the
// one it waits for.
//
// Two environment switches, for A/B runs (read per call): KILN_MOE_SM90_LAG=1 (default 2; more would deadlock a
// four-stage ring, see the kernel), the producer's lag; KILN_MOE_SM90_TAIL=0 runs tiles of ≤ 64 rows on one
// warpgroup (the other idles) instead of splitting them.
#pragma once

#include <cstdint>

#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// Whether the Hopper form runs: the current device is compute capability 9.0 (it runs sm_90a code) and the
// environment does not set KILN_MOE_GROUPED_SM90=0 (then moe_grouped_gemm.cu's mma.sync form runs: A/B runs, tests).
bool moe_grouped_sm90_applies();

// gate_up = true: a = x [n, k_dim] gathered through pair_order / top_k, w = gate_up [E, 2·n_dim, k_dim], out = bf16
// h [pairs, n_dim] in grouped order (SwiGLU, `limit` clamps). false: a = h [pairs, k_dim] in grouped order, w = down
// [E, n_dim, k_dim], out = fp32 y [pairs, n_dim] in pair order, × route_weight (may be null). Preconditions as
// moe_grouped_gemm.h's functions check them: k_dim, n_dim multiples of 8, a and w 16-byte aligned, pairs > 0.
Status moe_grouped_gemm_sm90(bool gate_up, const uint16_t* a, int64_t pairs, int64_t top_k, int64_t k_dim,
                             const uint16_t* w, int64_t n_dim, int64_t num_experts, const MoeDispatch& d,
                             const float* route_weight, float limit, void* out, StreamHandle stream);

}  // namespace kiln::cuda
