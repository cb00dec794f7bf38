// Kernel timings on one GPU beside their floors: MLA decode over the paged bf16 cache at several contexts
// (GLM-4.7-Flash: 20 heads, 512 + 64 latent, 64-token pages), the decode expert GEMV (64 experts, top-4, hidden
// 2048, inter 1536), MLA prefill (expanded form, 4096 new rows at the end of a 4K / 32K / 128K context) and the
// prefill routed experts (grouped tensor-core GEMM vs the GEMV path) beside a cuBLAS bf16 GEMM's rate, the decode
// projections (skinny GEMM vs cuBLAS at the step's shapes), the fused MoE gate + grouping, the batch-invariant
// decode products, the decode MoE layer (routed experts, shared expert apart or folded in) and MLA decode with
// several rows per sequence. Times are CUDA-event medians; inputs are random and rotated so the L2 does not serve
// them.
// Usage: kiln_bench_kernel_bench [moe_batched | mla_rows | skinny | mla_prefill]   (moe_batched: the decode MoE
// layer in batches of steps; mla_rows: MLA decode as the runner calls it, one-row MLA decode and several rows per
// sequence; skinny: the decode GEMVs one by one and a layer's eight in a row; mla_prefill: the MLA prefill
// section; none: everything)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "builtin/paged_mla_kv_layout.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/head_batched_gemm.h"
#include "kernels/cuda/mla_kv_expand_sm90.h"
#include "kernels/cuda/mla_prefill.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_gate_gemv.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "runtime/cuda/mla_prefill_attention.h"
#include "runtime/cuda/model_glue_kernels.h"
#include "kernels/cuda/moe_route_group.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/skinny_gemm.h"
#include "bench_check.h"

namespace {


template <class T>
T* device_random(size_t n, uint64_t seed) {
  std::vector<T> host(n);
  std::mt19937_64 rng(seed);
  for (auto& v : host) {
    if constexpr (sizeof(T) == 2)
      v = static_cast<T>(0x3c00 + (rng() % 0x600) - 0x300 + ((rng() & 1) << 15));  // bf16 of modest magnitude
    else
      v = static_cast<T>(std::uniform_real_distribution<float>(-1, 1)(rng));
  }
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class Fn>
float median_ms(Fn&& fn, int iters) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) fn(i);
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    fn(i);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Per-call time of `reps` back-to-back calls between one event pair (median over `iters` batches), so the
// ~8 µs launch latency of a lone call drops out and the figure is the GPU time of a call inside a stream.
template <class Fn>
float median_ms_per_call(Fn&& fn, int reps, int iters) {
  return median_ms(
             [&](int i) {
               for (int r = 0; r < reps; ++r) fn(i * reps + r);
             },
             iters) /
         reps;
}

uint16_t* device_bf16(size_t n, float bound, uint64_t seed) {
  uint16_t* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * 2));
  CHECK_OK(kiln::cuda::fill_uniform_bf16(d, n, bound, seed, nullptr));
  return d;
}

// The rate the prefill sections are measured against: an 8192³ bf16 cublasGemmEx (fp32 accumulation), FLOP/s.
double cublas_reference_rate(cublasHandle_t blas) {
  const int64_t g = 8192;
  uint16_t *ga = device_bf16(g * g, 1.f, 21), *gb = device_bf16(g * g, 1.f, 22), *gc = device_bf16(g * g, 1.f, 23);
  const float one = 1.f, zero = 0.f;
  const float gemm_ms = median_ms(
      [&](int) {
        if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, g, g, g, &one, ga, CUDA_R_16BF, g, gb, CUDA_R_16BF, g, &zero, gc,
                         CUDA_R_16BF, g, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
          std::exit(1);
      },
      20);
  const double peak = 2.0 * g * g * g / (gemm_ms * 1e-3);
  for (uint16_t* ptr : {ga, gb, gc}) CHECK_CUDA(cudaFree(ptr));
  std::printf("\ncuBLAS bf16 GEMM 8192^3: %.3f ms -> %.1f TFLOP/s (the reference below)\n", gemm_ms, peak / 1e12);
  return peak;
}

// MLA prefill, GLM-4.7-Flash attention shapes: 4096 new rows of one sequence at the end of a 4K / 32K / 128K
// context. "wgmma" is the attention kernel over already expanded K / V as dispatched on the device (the Hopper form on
// compute capability 9.0), "mmasync" the FlashAttention-2 form forced; "path" adds the latent gather from 64-token
// pages and the kv_b expansion GEMM (mla_prefill_attention). FLOPs count the causal pairs only:
// 2 · H · (qk + v) · Σ over rows of the keys each sees. `peak` is cublas_reference_rate's.
void bench_mla_prefill(cublasHandle_t blas, double peak) {
  const int64_t heads = 20, nope = 192, rope = 64, vd = 256, latent = 512, row = latent + rope, block = 64;
  const int64_t q_len = 4096, kvw = heads * (nope + vd);
  std::printf("\nMLA prefill (GLM-4.7-Flash: %lld heads, nope %lld + rope %lld, v %lld, latent %lld; %lld new rows)\n",
              (long long)heads, (long long)nope, (long long)rope, (long long)vd, (long long)latent, (long long)q_len);
  std::printf("%8s %7s %10s %9s %8s\n", "kv_len", "what", "us", "TFLOP/s", "%cublas");
  uint16_t* q = device_bf16(size_t(q_len) * heads * (nope + rope), 1.f, 31);
  uint16_t* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, q_len * heads * vd * 2));
  for (int64_t kv_len : {4096, 8192, 16384, 32768, 131072}) {
    double pairs = 0;
    for (int64_t i = 0; i < q_len; ++i) pairs += double(kv_len - q_len + i + 1);
    const double flops = 2.0 * heads * (nope + rope + vd) * pairs;
    const int iters = kv_len > 32768 ? 10 : 20;
    auto report = [&](const char* what, float ms) {
      std::printf("%8lld %7s %10.1f %9.1f %7.1f%%\n", (long long)kv_len, what, ms * 1e3, flops / (ms * 1e-3) / 1e12,
                  100.0 * flops / (ms * 1e-3) / peak);
    };

    // Kernel alone: K_nope / V interleaved per head as the expansion GEMM writes them, k_rope in latent rows.
    {
      uint16_t* kv = device_bf16(size_t(kv_len) * kvw, 1.f, 32);
      uint16_t* lat = device_bf16(size_t(kv_len) * row, 1.f, 33);
      const kiln::cuda::MlaPrefillSeq seq{0, static_cast<int32_t>(q_len), 0, static_cast<int32_t>(kv_len)};
      kiln::cuda::MlaPrefillSeq* d_seq = nullptr;
      CHECK_CUDA(cudaMalloc(&d_seq, sizeof(seq)));
      CHECK_CUDA(cudaMemcpy(d_seq, &seq, sizeof(seq), cudaMemcpyHostToDevice));
      kiln::cuda::MlaPrefillParams p;
      p.q = q, p.q_row_stride = heads * (nope + rope);
      p.k_nope = kv, p.k_nope_key_stride = kvw, p.k_nope_head_stride = nope + vd;
      p.k_rope = lat + latent, p.k_rope_key_stride = row;
      p.v = kv + nope, p.v_key_stride = kvw, p.v_head_stride = nope + vd;
      p.out = out, p.out_row_stride = heads * vd;
      p.seqs = d_seq, p.num_seqs = 1, p.max_q_len = q_len, p.total_keys = kv_len;
      p.num_heads = heads, p.nope_dim = nope, p.rope_dim = rope, p.v_dim = vd, p.scale = 0.0625f;
      report("wgmma", median_ms([&](int) { CHECK_OK(kiln::cuda::mla_prefill_bf16(p, nullptr)); }, iters));
      p.heads_fastest = false;  // the other block order (head-major)
      report("wgmma-h", median_ms([&](int) { CHECK_OK(kiln::cuda::mla_prefill_bf16(p, nullptr)); }, iters));
      p.heads_fastest = true;
      for (int group : {2, 4, 7, 10}) {  // heads in groups (MlaPrefillParams::head_group)
        p.head_group = group;
        const std::string what = "wgmma-g" + std::to_string(group);
        report(what.c_str(), median_ms([&](int) { CHECK_OK(kiln::cuda::mla_prefill_bf16(p, nullptr)); }, iters));
      }
      p.head_group = 0;
      // The model's layout (mla_prefill_attention: the head-batched expansion writes [heads][keys][nope + v]), every
      // block order ("hm-h": heads first, "hm-t": head-major, "hm-gN": heads in groups of N).
      {
        uint16_t* kv_hm = device_bf16(size_t(kv_len) * kvw, 1.f, 36);
        kiln::cuda::MlaPrefillParams m = p;
        m.k_nope = kv_hm, m.k_nope_key_stride = nope + vd, m.k_nope_head_stride = kv_len * (nope + vd);
        m.v = kv_hm + nope, m.v_key_stride = nope + vd, m.v_head_stride = kv_len * (nope + vd);
        for (int order : {-1, 0, 2, 4, 7, 10}) {
          m.heads_fastest = order != 0, m.head_group = std::max(order, 0);
          const std::string what = order < 0 ? "hm-h" : order == 0 ? "hm-t" : "hm-g" + std::to_string(order);
          report(what.c_str(), median_ms([&](int) { CHECK_OK(kiln::cuda::mla_prefill_bf16(m, nullptr)); }, iters));
        }
        CHECK_CUDA(cudaFree(kv_hm));
      }
      p.use_wgmma = false;
      report("mmasync", median_ms([&](int) { CHECK_OK(kiln::cuda::mla_prefill_bf16(p, nullptr)); }, iters));
      for (void* ptr : {(void*)kv, (void*)lat, (void*)d_seq}) CHECK_CUDA(cudaFree(ptr));
    }

    // The whole path from the paged cache (pages in shuffled order).
    {
      const int64_t blocks = kv_len / block;
      uint16_t* pages = device_bf16(size_t(blocks) * block * row, 1.f, 34);
      uint16_t* kv_b = device_bf16(size_t(kvw) * latent, 0.05f, 35);
      std::vector<int32_t> tables(blocks);
      std::iota(tables.begin(), tables.end(), 0);
      std::shuffle(tables.begin(), tables.end(), std::mt19937_64(3));
      int32_t* d_tables = nullptr;
      CHECK_CUDA(cudaMalloc(&d_tables, blocks * 4));
      CHECK_CUDA(cudaMemcpy(d_tables, tables.data(), blocks * 4, cudaMemcpyHostToDevice));
      const std::vector<kiln::cuda::MlaPrefillSequence> seqs{{0, q_len, kv_len, 0}};
      const kiln::cuda::MlaPrefillDims dims{heads, nope, rope, vd, latent};
      const size_t ws_bytes = kiln::cuda::mla_prefill_workspace_bytes(1, kv_len, dims);
      void* ws = nullptr;
      CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
      // The built-in bf16 layout gathers the cached rows, as in a model's step.
      kiln::ModelInfo info;
      info.kv_lora_rank = latent;
      info.qk_rope_head_dim = rope;
      kiln::RecipeSection kv_section("kv");
      kv_section.set("block_size", block);
      kiln::CreateContext ctx;
      ctx.section = &kv_section, ctx.device = kiln::Device::cuda(0), ctx.model = &info;
      auto layout = kiln::builtin::create_bf16_kv_layout_cuda(ctx);
      CHECK_OK(layout.status());
      kiln::cuda::MlaPrefillArgs a;
      a.layout = layout.value().get(), a.stream = kiln::Stream{kiln::Device::cuda(0), nullptr};
      a.seqs = seqs, a.dims = dims, a.q = q, a.pages = pages, a.block_size = block, a.block_tables = d_tables;
      a.max_blocks = blocks, a.kv_b = kv_b, a.scale = 0.0625f, a.out = out, a.workspace = ws, a.workspace_bytes = ws_bytes;
      report("path", median_ms([&](int) { CHECK_OK(kiln::cuda::mla_prefill_attention(a, blas, nullptr)); }, iters));
      setenv("KILN_MLA_KV_EXPAND", "sm90", 1);  // the one-launch Hopper expansion (opt-in), for the A/B
      report("path-x90", median_ms([&](int) { CHECK_OK(kiln::cuda::mla_prefill_attention(a, blas, nullptr)); }, iters));
      setenv("KILN_MLA_KV_EXPAND", "heads", 1);  // one cuBLAS call per head (the form before the batched one)
      report("path-hd", median_ms([&](int) { CHECK_OK(kiln::cuda::mla_prefill_attention(a, blas, nullptr)); }, iters));
      unsetenv("KILN_MLA_KV_EXPAND");

      // The kv_b expansion alone (the pages as latent rows): one Hopper launch, one cuBLASLt launch over the heads
      // (the default), one cuBLAS call per head.
      // FLOPs 2 · keys · latent · H · (nope + v); bytes: the K_nope | V it writes.
      uint16_t* kv = nullptr;
      CHECK_CUDA(cudaMalloc(&kv, size_t(kv_len) * kvw * 2));
      const double x_flops = 2.0 * kv_len * latent * kvw, x_bytes = 2.0 * kv_len * kvw;
      auto x_report = [&](const char* what, float ms) {
        std::printf("%8lld %7s %10.1f %9.1f %7.1f%%   %.0f GB/s written\n", (long long)kv_len, what, ms * 1e3,
                    x_flops / (ms * 1e-3) / 1e12, 100.0 * x_flops / (ms * 1e-3) / peak, x_bytes / (ms * 1e-3) / 1e9);
      };
      if (kiln::cuda::mla_kv_expand_sm90_supported(latent, row, nope + vd, pages, kv_b, kv))
        x_report("expand", median_ms([&](int) {
                   CHECK_OK(kiln::cuda::mla_kv_expand_sm90(pages, kv_len, row, latent, kv_b, heads, nope + vd, kv,
                                                           nullptr));
                 }, iters));
      void* lt_ws = nullptr;
      CHECK_CUDA(cudaMalloc(&lt_ws, kiln::cuda::kHeadBatchedGemmWorkspaceBytes));
      if (kiln::cuda::head_batched_gemm_bf16(pages, kv_len, latent, row, kv_b, nope + vd, heads, kv, lt_ws, nullptr).ok())
        x_report("xpand-lt", median_ms([&](int) {
                   CHECK_OK(kiln::cuda::head_batched_gemm_bf16(pages, kv_len, latent, row, kv_b, nope + vd, heads, kv,
                                                               lt_ws, nullptr));
                 }, iters));
      else
        std::printf("%8lld xpand-lt  declined by cuBLASLt (the path runs one cuBLAS call per head)\n", (long long)kv_len);
      x_report("xpand-cb", median_ms([&](int) {
                 const float one = 1.f, zero = 0.f;
                 for (int64_t h = 0; h < heads; ++h)
                   if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(nope + vd), int(kv_len), int(latent), &one,
                                    kv_b + h * (nope + vd) * latent, CUDA_R_16BF, int(latent), pages, CUDA_R_16BF,
                                    int(row), &zero, kv + h * kv_len * (nope + vd), CUDA_R_16BF, int(nope + vd),
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                     std::exit(1);
               }, iters));
      CHECK_CUDA(cudaFree(kv));
      CHECK_CUDA(cudaFree(lt_ws));
      for (void* ptr : {(void*)pages, (void*)kv_b, (void*)d_tables, ws}) CHECK_CUDA(cudaFree(ptr));
    }
  }
  CHECK_CUDA(cudaFree(q));
  CHECK_CUDA(cudaFree(out));
}

// Routed experts for prefill, GLM-4.7-Flash shapes (64 experts, top-4, hidden 2048, inter 1536), random distinct
// routing: the tensor-core grouped path (moe_grouped_gemm.h) beside the GEMV path of moe_experts.h. FLOPs:
// 2 · pairs · 3 · inter · hidden. "grouped" is the two grouped GEMMs alone; "path" / "gemv" add the grouping and the
// combine, as the runner's MoE block runs them; "dense" is cuBLAS on the same FLOPs as two plain GEMMs over all pairs
// (no routing), the ceiling a grouped GEMM can hope for; "gate_up" / "down" are the two grouped GEMMs apart (rated on
// their own 2 / 3 and 1 / 3 of the FLOPs). `peak` is cublas_reference_rate's. KILN_BENCH_MOE_TOKENS=N runs only N
// tokens (e.g. under ncu).
void bench_moe_prefill(cublasHandle_t blas, double peak) {
  const int64_t experts = 64, top_k = 4, hidden = 2048, inter = 1536;
  std::printf("\nMoE prefill experts (64 experts, top-4, hidden 2048, inter 1536)\n");
  std::printf("%7s %8s %10s %9s %8s\n", "tokens", "what", "us", "TFLOP/s", "%cublas");
  uint16_t* gate_up = device_bf16(size_t(experts) * 2 * inter * hidden, 0.05f, 41);
  uint16_t* down = device_bf16(size_t(experts) * hidden * inter, 0.05f, 42);
  std::vector<int64_t> token_counts = {32, 128, 512, 4096, 16384};
  if (const char* only = std::getenv("KILN_BENCH_MOE_TOKENS")) token_counts = {std::atoll(only)};  // e.g. under ncu
  for (int64_t tokens : token_counts) {
    const int64_t pairs = tokens * top_k;
    const double flops = 2.0 * pairs * 3 * inter * hidden;
    std::vector<int32_t> ids(pairs);
    std::mt19937_64 rng(6);
    std::vector<int32_t> all(experts);
    std::iota(all.begin(), all.end(), 0);
    for (int64_t t = 0; t < tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      std::copy(all.begin(), all.begin() + top_k, ids.begin() + t * top_k);
    }
    int32_t *d_ids, *offsets, *active, *order;
    CHECK_CUDA(cudaMalloc(&d_ids, pairs * 4));
    CHECK_CUDA(cudaMemcpy(d_ids, ids.data(), pairs * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&offsets, (experts + 1) * 4));
    CHECK_CUDA(cudaMalloc(&active, experts * 4));
    CHECK_CUDA(cudaMalloc(&order, pairs * 4));
    uint16_t* x = device_bf16(size_t(tokens) * hidden, 1.f, 43);
    uint16_t *h = nullptr, *out = nullptr;
    float* y = nullptr;
    float* rw = device_random<float>(pairs, 44);
    CHECK_CUDA(cudaMalloc(&h, size_t(pairs) * 2 * inter * 2));  // 2·inter: also the dense GEMM's output
    CHECK_CUDA(cudaMalloc(&y, size_t(pairs) * hidden * 4));
    CHECK_CUDA(cudaMalloc(&out, size_t(tokens) * hidden * 2));
    const kiln::cuda::MoeDispatch d{offsets, active, order};
    auto report = [&](const char* what, float ms, double share = 1.0) {  // share: of the three products' FLOPs
      std::printf("%7lld %8s %10.1f %9.1f %7.1f%%\n", (long long)tokens, what, ms * 1e3,
                  share * flops / (ms * 1e-3) / 1e12, 100.0 * share * flops / (ms * 1e-3) / peak);
    };
    const int iters = tokens >= 4096 ? 10 : 30;
    const float group_ms =
        median_ms([&](int) { CHECK_OK(kiln::cuda::moe_group_by_expert(d_ids, pairs, experts, d, nullptr)); }, iters);
    std::printf("%7lld %8s %10.1f\n", (long long)tokens, "group", group_ms * 1e3);
    auto gate_up_only = [&]() {
      CHECK_OK(kiln::cuda::moe_gate_up_swiglu_grouped_bf16(x, tokens, top_k, hidden, inter, gate_up, experts, d,
                                                           INFINITY, h, nullptr));
    };
    auto down_only = [&]() {
      CHECK_OK(kiln::cuda::moe_down_grouped_bf16(h, pairs, inter, hidden, down, experts, d, rw, y, nullptr));
    };
    auto grouped = [&]() {
      gate_up_only();
      down_only();
    };
    report("grouped", median_ms([&](int) { grouped(); }, iters));
    report("gate_up", median_ms([&](int) { gate_up_only(); }, iters), 2.0 / 3);
    report("down", median_ms([&](int) { down_only(); }, iters), 1.0 / 3);
    // The same GEMMs in the mma.sync form (what devices other than compute capability 9.0 run).
    setenv("KILN_MOE_GROUPED_SM90", "0", 1);
    report("mmasync", median_ms([&](int) { grouped(); }, iters));
    unsetenv("KILN_MOE_GROUPED_SM90");
    report("path", median_ms(
                       [&](int) {
                         CHECK_OK(kiln::cuda::moe_group_by_expert(d_ids, pairs, experts, d, nullptr));
                         grouped();
                         CHECK_OK(kiln::cuda::moe_combine_bf16(y, tokens, top_k, hidden, nullptr, out, nullptr));
                       },
                       iters));
    report("gemv", median_ms(
                       [&](int) {
                         CHECK_OK(kiln::cuda::moe_group_by_expert(d_ids, pairs, experts, d, nullptr));
                         CHECK_OK(kiln::cuda::moe_gate_up_swiglu_bf16(x, tokens, top_k, hidden, inter, gate_up,
                                                                      experts, d, INFINITY, h, nullptr));
                         CHECK_OK(kiln::cuda::moe_down_bf16(h, pairs, inter, hidden, down, experts, d, rw, y, nullptr));
                         CHECK_OK(kiln::cuda::moe_combine_bf16(y, tokens, top_k, hidden, nullptr, out, nullptr));
                       },
                       tokens >= 4096 ? 3 : iters));
    if (tokens >= 512) {
      // Dense stand-in operands: [pairs, hidden] rows (y's bytes reused), one expert's weights for every pair.
      uint16_t* xp = reinterpret_cast<uint16_t*>(y);
      const float one = 1.f, zero = 0.f;
      report("dense", median_ms(
                          [&](int) {
                            if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * inter, pairs, hidden, &one, gate_up,
                                             CUDA_R_16BF, hidden, xp, CUDA_R_16BF, hidden, &zero, h, CUDA_R_16BF,
                                             2 * inter, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS ||
                                cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, hidden, pairs, inter, &one, down,
                                             CUDA_R_16BF, inter, h, CUDA_R_16BF, inter, &zero, xp, CUDA_R_16BF, hidden,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                              std::exit(1);
                          },
                          iters));
    }
    for (void* ptr : {(void*)d_ids, (void*)offsets, (void*)active, (void*)order, (void*)x, (void*)h, (void*)y,
                      (void*)rw, (void*)out})
      CHECK_CUDA(cudaFree(ptr));
  }
  CHECK_CUDA(cudaFree(gate_up));
  CHECK_CUDA(cudaFree(down));
}


// The decode step's projections (GLM-4.7-Flash) at n rows: the skinny tensor-core GEMM that linear() runs where
// skinny_gemm_preferred(n, out) beside cuBLAS's GEMM on the same operands. Floor = (W + x + y bytes) ÷ copy rate.
void bench_skinny_gemm(const cudaDeviceProp& prop, double bw) {
  struct Proj {
    const char* name;
    int64_t out, in;
    bool f32_out;  // as the runner stores it
  };
  const Proj projs[] = {{"q_a", 768, 2048, false},       {"q_b", 5120, 768, true},
                        {"kv_a", 576, 2048, true},        {"o_proj", 2048, 5120, false},
                        {"shared_gate_up", 3072, 2048, false}, {"shared_down", 2048, 1536, false},
                        {"lm_head", 154880, 2048, true}};
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  std::printf("\nDecode projections: skinny GEMM (linear() for n <= %lld, lm_head n <= %lld) vs cuBLAS GemmEx\n",
              (long long)kiln::cuda::kSkinnyGemmMaxRows, (long long)kiln::cuda::kSkinnyGemmMaxRowsWideOut);
  std::printf("%-15s %4s %10s %10s %10s %8s %8s\n", "proj", "n", "skinny_us", "cublas_us", "floor_us", "%fl_sk",
              "%fl_cb");
  const int64_t ns[] = {1, 4, 16, 32, 64};
  double layer_skinny[5] = {}, layer_cublas[5] = {}, layer_floor[5] = {};  // the six per-layer projections
  for (const Proj& pj : projs) {
    const size_t w_elems = size_t(pj.out) * pj.in;
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t(256) << 20) / (w_elems * 2)));
    uint16_t* w = device_random<uint16_t>(w_elems * copies, 21);
    uint16_t* x = device_random<uint16_t>(size_t(64) * pj.in, 22);
    void* y = nullptr;
    CHECK_CUDA(cudaMalloc(&y, size_t(64) * pj.out * 4));
    const kiln::DType yt = pj.f32_out ? kiln::DType::kF32 : kiln::DType::kBF16;
    for (int ni = 0; ni < 5; ++ni) {
      const int64_t n = ns[ni];
      const float skinny_ms = median_ms(
          [&](int i) {
            CHECK_OK(kiln::cuda::skinny_gemm_bf16(x, n, pj.in, w + (i % copies) * w_elems, pj.out, y, yt, false,
                                                  prop.multiProcessorCount, nullptr));
          },
          100);
      const float alpha = 1.f, beta = 0.f;
      const float cublas_ms = median_ms(
          [&](int i) {
            const cublasStatus_t st = cublasGemmEx(
                blas, CUBLAS_OP_T, CUBLAS_OP_N, int(pj.out), int(n), int(pj.in), &alpha, w + (i % copies) * w_elems,
                CUDA_R_16BF, int(pj.in), x, CUDA_R_16BF, int(pj.in), &beta, y, pj.f32_out ? CUDA_R_32F : CUDA_R_16BF,
                int(pj.out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (st != CUBLAS_STATUS_SUCCESS) std::exit(1);
          },
          100);
      const double bytes = double(w_elems) * 2 + double(n) * pj.in * 2 + double(n) * pj.out * (pj.f32_out ? 4 : 2);
      const double floor_us = bytes / bw * 1e6;
      std::printf("%-15s %4lld %10.2f %10.2f %10.2f %7.1f%% %7.1f%%\n", pj.name, (long long)n, skinny_ms * 1e3,
                  cublas_ms * 1e3, floor_us, 100.0 * floor_us / (skinny_ms * 1e3), 100.0 * floor_us / (cublas_ms * 1e3));
      if (std::string(pj.name) != "lm_head") {
        layer_skinny[ni] += skinny_ms * 1e3, layer_cublas[ni] += cublas_ms * 1e3, layer_floor[ni] += floor_us;
      }
    }
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
  }
  for (int ni = 0; ni < 5; ++ni)
    std::printf("%-15s %4lld %10.2f %10.2f %10.2f %7.1f%% %7.1f%%\n", "per-layer sum", (long long)ns[ni],
                layer_skinny[ni], layer_cublas[ni], layer_floor[ni], 100.0 * layer_floor[ni] / layer_skinny[ni],
                100.0 * layer_floor[ni] / layer_cublas[ni]);
  cublasDestroy(blas);
}

// The decode step's dense GEMVs (GLM-4.7-Flash, one layer: q_a, q_b, kv_a, the per-head absorption and
// un-absorption, o_proj, the shared expert's gate_up + SwiGLU and down; and the lm_head) through the skinny GEMM
// at n = 1..8 rows, on one stream created here. "lone": one call between two events (launch latency included);
// "stream": the per-call time of 20 back-to-back calls (programmatic dependent launch overlaps each call's
// prologue with the previous call's tail); then one layer's eight GEMVs in a row, on the stream and replayed
// from a CUDA graph. Weights rotate over copies so the L2 does not serve them; GB/s = (W + x + y bytes) ÷ time.
// KILN_PDL=0 turns the overlap off (an A/B switch read once per process).
void bench_skinny_decode(const cudaDeviceProp& prop, double bw) {
  using kiln::cuda::SkinnyStrides;
  const int64_t H = 20, nope = 192, rope = 64, v = 256, L = 512, qk = nope + rope, D = L + rope;
  const int64_t hidden = 2048, q_lora = 768, kv_lora = 576, inter = 1536, vocab = 154880;
  const int sms = prop.multiProcessorCount;
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct Gemv {
    const char* name;
    int64_t w_elems;  // per copy
    double w_bytes_read;
    int64_t in, out_elems, out_bytes;  // per row of x / y
    uint16_t* w;
    int copies;
  };
  // x / y buffers large enough for every GEMV at 8 rows.
  const int64_t kMaxRows = 8;
  uint16_t* x = device_bf16(size_t(kMaxRows) * H * L, 1.f, 51);
  void* y = nullptr;
  CHECK_CUDA(cudaMalloc(&y, size_t(kMaxRows) * vocab * 4));
  std::vector<Gemv> g = {
      {"q_a", q_lora * hidden, 2.0 * q_lora * hidden, hidden, q_lora, q_lora * 2},
      {"q_b", H * qk * q_lora, 2.0 * H * qk * q_lora, q_lora, H * qk, H * qk * 4},
      {"kv_a", kv_lora * hidden, 2.0 * kv_lora * hidden, hidden, kv_lora, kv_lora * 4},
      {"absorb", H * L * nope, 2.0 * H * L * nope, H * qk, H * L, H * L * 4},
      {"unabsorb", H * (nope + v) * L, 2.0 * H * v * L, H * L, H * v, H * v * 2},
      {"o_proj", hidden * H * v, 2.0 * hidden * H * v, H * v, hidden, hidden * 2},
      {"gate_up_swiglu", 2 * inter * hidden, 4.0 * inter * hidden, hidden, inter, inter * 2},
      {"down", hidden * inter, 2.0 * hidden * inter, inter, hidden, hidden * 2},
      {"lm_head", vocab * hidden, 2.0 * vocab * hidden, hidden, vocab, vocab * 4},
  };
  for (size_t i = 0; i < g.size(); ++i) {
    g[i].copies = g[i].w_elems * 2 > (int64_t(256) << 20) ? 2 : 8;
    g[i].w = device_bf16(size_t(g[i].w_elems) * g[i].copies, 0.05f, 60 + i);
  }
  auto run = [&](size_t i, int64_t n, int copy) {
    const Gemv& G = g[i];
    const uint16_t* w = G.w + size_t(copy % G.copies) * G.w_elems;
    const std::string name = G.name;
    if (name == "absorb") {
      SkinnyStrides s;
      s.batches = H, s.x_row = H * qk, s.x_batch = qk, s.w_batch = L * nope, s.y_row = H * D, s.y_batch = D;
      CHECK_OK(kiln::cuda::skinny_gemm_strided_batched_bf16(x, n, nope, w, L, y, kiln::DType::kF32, s, false, sms,
                                                            stream));
    } else if (name == "unabsorb") {
      SkinnyStrides s;
      s.batches = H, s.x_row = H * L, s.x_batch = L, s.w_batch = (nope + v) * L, s.y_row = H * v, s.y_batch = v;
      CHECK_OK(kiln::cuda::skinny_gemm_strided_batched_bf16(x, n, L, w + nope * L, v, y, kiln::DType::kBF16, s,
                                                            false, sms, stream));
    } else if (name == "gate_up_swiglu") {
      CHECK_OK(kiln::cuda::skinny_gemm_swiglu_bf16(x, n, hidden, w, inter, static_cast<uint16_t*>(y), stream));
    } else {
      const bool f32 = G.out_bytes == G.out_elems * 4;
      CHECK_OK(kiln::cuda::skinny_gemm_bf16(x, n, G.in, w, G.out_elems, y, f32 ? kiln::DType::kF32 : kiln::DType::kBF16,
                                            false, sms, stream));
    }
  };
  // Median over iters of the time of fn(i) on `stream`, ms.
  cudaEvent_t ea, eb;
  CHECK_CUDA(cudaEventCreate(&ea));
  CHECK_CUDA(cudaEventCreate(&eb));
  auto median_on_stream = [&](auto&& fn, int iters) {
    for (int i = 0; i < 3; ++i) fn(i);
    std::vector<float> t;
    for (int i = 0; i < iters; ++i) {
      CHECK_CUDA(cudaEventRecord(ea, stream));
      fn(i);
      CHECK_CUDA(cudaEventRecord(eb, stream));
      CHECK_CUDA(cudaEventSynchronize(eb));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, ea, eb));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const char* pdl = std::getenv("KILN_PDL");
  std::printf("\nDecode GEMVs through the skinny GEMM (%d SMs; KILN_PDL=%s; copy rate %.2f TB/s, H200 HBM 4.26 TB/s)\n",
              sms, pdl ? pdl : "unset", bw / 1e12);
  std::printf("%-15s %2s %9s %9s %9s %9s %8s %8s\n", "gemv", "n", "MB", "floor_us", "lone_us", "stream_us",
              "GB/s", "%4.26TB");
  constexpr int kReps = 20;
  for (size_t i = 0; i < g.size(); ++i)
    for (int64_t n : {1, 2, 4, 8}) {
      const Gemv& G = g[i];
      const double bytes = G.w_bytes_read + double(n) * G.in * 2 + double(n) * G.out_bytes;
      const float lone = median_on_stream([&](int it) { run(i, n, it); }, 100);
      const float per = median_on_stream([&](int it) {
                          for (int r = 0; r < kReps; ++r) run(i, n, it * kReps + r);
                        }, 25) / kReps;
      std::printf("%-15s %2lld %9.2f %9.2f %9.2f %9.2f %8.0f %7.1f%%\n", G.name, (long long)n, bytes / 1e6,
                  bytes / 4.26e12 * 1e6, lone * 1e3, per * 1e3, bytes / (per * 1e-3) / 1e9,
                  100.0 * bytes / (per * 1e-3) / 4.26e12);
    }
  // One layer's eight GEMVs (all but the lm_head) in the step's order, each layer on its own weight copy.
  std::printf("\nOne layer's 8 decode GEMVs in a row (q_a, q_b, kv_a, absorb, unabsorb, o_proj, gate_up_swiglu, down)\n");
  std::printf("%2s %9s %9s %11s %11s %8s %8s\n", "n", "MB", "floor_us", "stream_us", "graph_us", "GB/s", "%4.26TB");
  constexpr int kLayers = 8;
  for (int64_t n : {1, 2, 4, 8}) {
    double bytes = 0;
    for (size_t i = 0; i + 1 < g.size(); ++i)
      bytes += g[i].w_bytes_read + double(n) * g[i].in * 2 + double(n) * g[i].out_bytes;
    auto layers = [&](int it) {
      for (int l = 0; l < kLayers; ++l)
        for (size_t i = 0; i + 1 < g.size(); ++i) run(i, n, it * kLayers + l);
    };
    const float stream_ms = median_on_stream(layers, 25) / kLayers;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    layers(0);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    const float graph_ms = median_on_stream([&](int) { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }, 25) / kLayers;
    std::printf("%2lld %9.2f %9.2f %11.2f %11.2f %8.0f %7.1f%%\n", (long long)n, bytes / 1e6, bytes / 4.26e12 * 1e6,
                stream_ms * 1e3, graph_ms * 1e3, bytes / (graph_ms * 1e-3) / 1e9,
                100.0 * bytes / (graph_ms * 1e-3) / 4.26e12);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  for (Gemv& G : g) CHECK_CUDA(cudaFree(G.w));
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(y));
  CHECK_CUDA(cudaEventDestroy(ea));
  CHECK_CUDA(cudaEventDestroy(eb));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

// The MoE gate after its logits: moe_route + moe_group_by_expert (two launches) vs moe_route_and_group (one).
// Floor = logits + ids + weights + dispatch bytes ÷ copy rate (a few KB: both are launch/latency bound).
void bench_route_group(double bw) {
  const int64_t experts = 64, top_k = 4;
  kiln::cpu::MoeRouterConfig rc;
  rc.num_experts = experts;
  rc.top_k = top_k;
  rc.routed_scaling_factor = 1.8f;
  std::printf("\nMoE gate + grouping (64 experts, top-4)\n");
  std::printf("%7s %12s %10s %10s\n", "tokens", "two_launch", "fused_us", "floor_us");
  for (int64_t tokens : {1, 4, 16, 64}) {
    const int sets = 16;
    float* logits = device_random<float>(size_t(sets) * tokens * experts, 31);
    float* bias = device_random<float>(experts, 32);
    int32_t *ids, *offsets, *active, *order;
    float* weights;
    CHECK_CUDA(cudaMalloc(&ids, tokens * top_k * 4));
    CHECK_CUDA(cudaMalloc(&weights, tokens * top_k * 4));
    CHECK_CUDA(cudaMalloc(&offsets, (experts + 1) * 4));
    CHECK_CUDA(cudaMalloc(&active, experts * 4));
    CHECK_CUDA(cudaMalloc(&order, tokens * top_k * 4));
    const kiln::cuda::MoeDispatch d{offsets, active, order};
    const float two_ms = median_ms(
        [&](int i) {
          CHECK_OK(kiln::cuda::moe_route(logits + (i % sets) * tokens * experts, bias, tokens, rc, ids, weights, nullptr));
          CHECK_OK(kiln::cuda::moe_group_by_expert(ids, tokens * top_k, experts, d, nullptr));
        },
        100);
    const float fused_ms = median_ms(
        [&](int i) {
          CHECK_OK(kiln::cuda::moe_route_and_group(logits + (i % sets) * tokens * experts, bias, tokens, rc, ids,
                                                   weights, d, nullptr));
        },
        100);
    const double bytes = double(tokens) * experts * 4 + experts * 4 + double(tokens) * top_k * 12 + (2 * experts + 1) * 4;
    std::printf("%7lld %12.2f %10.2f %10.3f\n", (long long)tokens, two_ms * 1e3, fused_ms * 1e3, bytes / bw * 1e6);
    for (void* ptr : {(void*)logits, (void*)bias, (void*)ids, (void*)weights, (void*)offsets, (void*)active, (void*)order})
      CHECK_CUDA(cudaFree(ptr));
  }
}

// The batch-invariant replacements of the decode step's cuBLAS calls, GLM-4.7-Flash shapes, vs those calls: MLA's
// per-head absorption products (q_lat = W_UK[h]ᵀ·q_nope through the transposed W_UK, attn = W_UV[h]·o_lat; the
// skinny GEMM as a strided batch over 20 heads vs cublasGemmStridedBatchedEx on kv_b) and the MoE router (the fp32
// gate GEMV on the bf16 input vs bf16→fp32 cast + cublasSgemm). Weights rotate over copies to keep the L2 cold.
// Floor = weight bytes ÷ copy rate.
void bench_invariant_decode_products(const cudaDeviceProp& prop, double bw) {
  const int64_t H = 20, nope = 192, rope = 64, v = 256, L = 512, qk = nope + rope, D = L + rope;
  const int64_t hidden = 2048, experts = 64;
  const size_t kv_b_elems = size_t(H) * (nope + v) * L, uk_elems = size_t(H) * L * nope;
  const int copies = 16;
  uint16_t* kv_b = device_random<uint16_t>(kv_b_elems * copies, 41);
  uint16_t* uk_t = device_random<uint16_t>(uk_elems * copies, 42);
  float* router = device_random<float>(size_t(experts) * hidden * copies, 43);
  uint16_t* q = device_random<uint16_t>(size_t(32) * H * qk, 44);
  uint16_t* o = device_random<uint16_t>(size_t(32) * H * L, 45);
  uint16_t* x = device_random<uint16_t>(size_t(32) * hidden, 46);
  float *q_abs, *x32, *logits;
  uint16_t* attn;
  CHECK_CUDA(cudaMalloc(&q_abs, size_t(32) * H * D * 4));
  CHECK_CUDA(cudaMalloc(&attn, size_t(32) * H * v * 2));
  CHECK_CUDA(cudaMalloc(&x32, size_t(32) * hidden * 4));
  CHECK_CUDA(cudaMalloc(&logits, size_t(32) * experts * 4));
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  const float one = 1.f, zero = 0.f;
  std::printf("\nBatch-invariant decode products (20 heads, nope 192, v 256, latent 512; router 64 x 2048 fp32)\n");
  std::printf("%4s %11s %11s %11s %11s %9s %10s %10s %9s\n", "n", "absorb_us", "cb_absorb", "unabsorb", "cb_unabs",
              "floor_us", "gate_us", "cb_gate", "floor_us");
  for (int64_t n : {1, 2, 4, 6, 8, 12, 16, 24, 32}) {
    kiln::cuda::SkinnyStrides a, u;
    a.batches = H, a.x_row = H * qk, a.x_batch = qk, a.w_batch = L * nope, a.y_row = H * D, a.y_batch = D;
    u.batches = H, u.x_row = H * L, u.x_batch = L, u.w_batch = (nope + v) * L, u.y_row = H * v, u.y_batch = v;
    const float absorb_ms = median_ms(
        [&](int i) {
          CHECK_OK(kiln::cuda::skinny_gemm_strided_batched_bf16(q, n, nope, uk_t + (i % copies) * uk_elems, L, q_abs,
                                                                kiln::DType::kF32, a, false,
                                                                prop.multiProcessorCount, nullptr));
        },
        100);
    const float cb_absorb_ms = median_ms(
        [&](int i) {
          if (cublasGemmStridedBatchedEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, L, n, nope, &one, kv_b + (i % copies) * kv_b_elems,
                                         CUDA_R_16BF, L, (nope + v) * L, q, CUDA_R_16BF, H * qk, qk, &zero, q_abs,
                                         CUDA_R_32F, H * D, D, H, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            std::exit(1);
        },
        100);
    const float unabsorb_ms = median_ms(
        [&](int i) {
          CHECK_OK(kiln::cuda::skinny_gemm_strided_batched_bf16(o, n, L, kv_b + (i % copies) * kv_b_elems + nope * L,
                                                                v, attn, kiln::DType::kBF16, u, false,
                                                                prop.multiProcessorCount, nullptr));
        },
        100);
    const float cb_unabsorb_ms = median_ms(
        [&](int i) {
          if (cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, v, n, L, &one,
                                         kv_b + (i % copies) * kv_b_elems + nope * L, CUDA_R_16BF, L, (nope + v) * L, o,
                                         CUDA_R_16BF, H * L, L, &zero, attn, CUDA_R_16BF, H * v, v, H,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            std::exit(1);
        },
        100);
    const float gate_ms = median_ms(
        [&](int i) {
          CHECK_OK(kiln::cuda::moe_gate_logits_bf16(x, n, hidden, router + (i % copies) * experts * hidden, experts,
                                                    logits, nullptr));
        },
        100);
    const float cb_gate_ms = median_ms(
        [&](int i) {
          CHECK_OK(kiln::cuda::bf16_to_f32(x, size_t(n) * hidden, x32, nullptr));
          if (cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, experts, n, hidden, &one,
                          router + (i % copies) * experts * hidden, hidden, x32, hidden, &zero, logits,
                          experts) != CUBLAS_STATUS_SUCCESS)
            std::exit(1);
        },
        100);
    const double floor_mla = double(uk_elems + size_t(H) * v * L) * 2 / bw * 1e6;
    const double floor_gate = double(experts) * hidden * 4 / bw * 1e6;
    std::printf("%4lld %11.2f %11.2f %11.2f %11.2f %9.2f %10.2f %10.2f %9.2f\n", (long long)n, absorb_ms * 1e3,
                cb_absorb_ms * 1e3, unabsorb_ms * 1e3, cb_unabsorb_ms * 1e3, floor_mla, gate_ms * 1e3,
                cb_gate_ms * 1e3, floor_gate);
  }
  cublasDestroy(blas);
  for (void* ptr : {(void*)kv_b, (void*)uk_t, (void*)router, (void*)q, (void*)o, (void*)x, (void*)q_abs, (void*)attn,
                    (void*)x32, (void*)logits})
    CHECK_CUDA(cudaFree(ptr));
}


// The MoE layer of one decode step at GLM-4.7-Flash's shapes (64 experts, top-4, hidden 2048, inter 1536, one
// shared expert of the routed shape) at 1 / 4 / 16 / 32 tokens, 20 back-to-back steps per event pair; routes drawn
// per step from 16 random sets and the shared expert from 8 copies, so consecutive steps read different weights
// (the L2 does not serve them). Three variants:
//   routed:         group + gate_up/SwiGLU + down + combine (the routed experts alone);
//   layer, apart:   group + routed experts + the shared expert as two skinny GEMMs + combine + the next
//                   residual add + RMSNorm (the runner's MoE layer before the shared expert was folded in);
//   layer, folded:  group + gate_up/SwiGLU + down with the shared expert in the same launches +
//                   moe_combine_add_rmsnorm_bf16 (four launches).
// Floor: the expected distinct experts' bytes (plus the shared expert's) at the copy bandwidth.
void bench_moe_batched(const cudaDeviceProp& prop, double bw) {
  const int64_t experts = 64, top_k = 4, hidden = 2048, inter = 1536, shared_copies = 8;
  const double expert_bytes = 3.0 * inter * hidden * 2;
  uint16_t* gate_up = device_random<uint16_t>(size_t(experts) * 2 * inter * hidden, 11);
  uint16_t* down = device_random<uint16_t>(size_t(experts) * hidden * inter, 12);
  uint16_t* shared_gate_up = device_random<uint16_t>(size_t(shared_copies) * 2 * inter * hidden, 15);
  uint16_t* shared_down = device_random<uint16_t>(size_t(shared_copies) * hidden * inter, 16);
  uint16_t* norm_w = device_random<uint16_t>(hidden, 17);
  uint16_t* x = device_random<uint16_t>(hidden * 64, 13);
  std::printf("\nMoE layer, 20 steps per event pair (64 experts, hidden 2048, inter 1536, top-4, 1 shared expert)\n");
  std::printf("%7s %8s %-15s %10s %10s %10s %8s\n", "tokens", "experts", "variant", "us", "floor_us", "TB/s",
              "%floor");
  for (int64_t tokens : {1, 4, 16, 32}) {
    const int64_t pairs = tokens * top_k;
    std::mt19937_64 rng(5);
    const int sets = 16;
    std::vector<int32_t> ids(size_t(sets) * pairs);
    std::vector<int> distinct(sets);
    for (int s = 0; s < sets; ++s) {
      std::vector<char> used(experts, 0);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<int32_t> all(experts);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        for (int64_t j = 0; j < top_k; ++j) {
          ids[s * pairs + t * top_k + j] = all[j];
          used[all[j]] = 1;
        }
      }
      distinct[s] = std::accumulate(used.begin(), used.end(), 0);
    }
    int32_t *d_ids, *offsets, *active, *order;
    CHECK_CUDA(cudaMalloc(&d_ids, ids.size() * 4));
    CHECK_CUDA(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&offsets, (experts + 1) * 4));
    CHECK_CUDA(cudaMalloc(&active, experts * 4));
    CHECK_CUDA(cudaMalloc(&order, pairs * 4));
    uint16_t *h, *outb, *shared_h, *shared_b, *normed;
    float *y, *resid, *rw = device_random<float>(pairs, 14);
    CHECK_CUDA(cudaMalloc(&h, pairs * inter * 2));
    CHECK_CUDA(cudaMalloc(&shared_h, tokens * inter * 2));
    CHECK_CUDA(cudaMalloc(&y, (pairs + tokens) * hidden * 4));
    CHECK_CUDA(cudaMalloc(&outb, tokens * hidden * 2));
    CHECK_CUDA(cudaMalloc(&shared_b, tokens * hidden * 2));
    CHECK_CUDA(cudaMalloc(&normed, tokens * hidden * 2));
    CHECK_CUDA(cudaMalloc(&resid, tokens * hidden * 4));
    CHECK_CUDA(cudaMemset(resid, 0, tokens * hidden * 4));
    const kiln::cuda::MoeDispatch d{offsets, active, order};
    auto routed = [&](int i, const kiln::cuda::MoeSharedExpert* shared) {
      CHECK_OK(kiln::cuda::moe_group_by_expert(d_ids + (i % sets) * pairs, pairs, experts, d, nullptr));
      CHECK_OK(kiln::cuda::moe_gate_up_swiglu_bf16(x, tokens, top_k, hidden, inter, gate_up, experts, d, INFINITY, h,
                                                   nullptr, shared));
      CHECK_OK(kiln::cuda::moe_down_bf16(h, pairs, inter, hidden, down, experts, d, rw, y, nullptr, shared));
    };
    auto shared_copy = [&](int i) {
      const int64_t c = i % shared_copies;
      return kiln::cuda::MoeSharedExpert{shared_gate_up + c * 2 * inter * hidden, shared_down + c * hidden * inter,
                                         tokens, shared_h, y + pairs * hidden};
    };
    const double mean_experts = std::accumulate(distinct.begin(), distinct.end(), 0.0) / sets;
    auto report = [&](const char* variant, double experts_read, float ms) {
      const double bytes = experts_read * expert_bytes;
      std::printf("%7lld %8.1f %-15s %10.2f %10.2f %10.2f %7.1f%%\n", (long long)tokens, experts_read, variant,
                  ms * 1e3, bytes / bw * 1e6, bytes / (ms * 1e-3) / 1e12, 100.0 * (bytes / bw) / (ms * 1e-3));
    };
    report("routed", mean_experts, median_ms_per_call(
                                       [&](int i) {
                                         routed(i, nullptr);
                                         CHECK_OK(kiln::cuda::moe_combine_bf16(y, tokens, top_k, hidden, nullptr,
                                                                               outb, nullptr));
                                       },
                                       20, 30));
    report("layer, apart", mean_experts + 1,
           median_ms_per_call(
               [&](int i) {
                 const kiln::cuda::MoeSharedExpert s = shared_copy(i);
                 routed(i, nullptr);
                 CHECK_OK(kiln::cuda::skinny_gemm_swiglu_bf16(x, tokens, hidden, s.gate_up, inter, shared_h, nullptr));
                 CHECK_OK(kiln::cuda::skinny_gemm_bf16(shared_h, tokens, inter, s.down, hidden, shared_b,
                                                       kiln::DType::kBF16, false, prop.multiProcessorCount, nullptr));
                 CHECK_OK(kiln::cuda::moe_combine_bf16(y, tokens, top_k, hidden, shared_b, outb, nullptr));
                 CHECK_OK(kiln::cuda::add_rmsnorm_bf16(outb, resid, norm_w, tokens, hidden, 1e-5f, normed, nullptr));
               },
               20, 30));
    report("layer, folded", mean_experts + 1,
           median_ms_per_call(
               [&](int i) {
                 const kiln::cuda::MoeSharedExpert s = shared_copy(i);
                 routed(i, &s);
                 CHECK_OK(kiln::cuda::moe_combine_add_rmsnorm_bf16(y, tokens, top_k, hidden, nullptr, s.y, resid,
                                                                   norm_w, 1e-5f, normed, nullptr));
               },
               20, 30));
    for (void* ptr : {(void*)d_ids, (void*)offsets, (void*)active, (void*)order, (void*)h, (void*)outb, (void*)y,
                      (void*)rw, (void*)shared_h, (void*)shared_b, (void*)normed, (void*)resid})
      CHECK_CUDA(cudaFree(ptr));
  }
  for (void* ptr : {(void*)gate_up, (void*)down, (void*)x, (void*)shared_gate_up, (void*)shared_down, (void*)norm_w})
    CHECK_CUDA(cudaFree(ptr));
}


// MLA decode, one query row, GLM-4.7-Flash shapes, one call per event pair. Several sequences' pages, rotated,
// keep the L2 cold.
void bench_mla_decode(const cudaDeviceProp& prop, double bw) {
  const int64_t heads = 20, block = 64, row = 576;
  std::printf("\nMLA decode (1 query, %lld heads, bf16 cache, block %lld)\n", (long long)heads, (long long)block);
  std::printf("%8s %7s %10s %10s %10s %8s\n", "context", "splits", "us", "floor_us", "TB/s", "%floor");
  for (int64_t ctx : {4096, 32768, 131072}) {
    const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t(600) << 20) / (ctx * row * 2)));
    const int64_t blocks = ctx / block;
    uint16_t* cache = device_random<uint16_t>(size_t(copies) * blocks * block * row, 7);
    std::vector<int32_t> tables(size_t(copies) * blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937_64(3));
    int32_t *d_tables, *d_seq, *d_len;
    CHECK_CUDA(cudaMalloc(&d_tables, tables.size() * 4));
    CHECK_CUDA(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> seqs(copies);
    std::iota(seqs.begin(), seqs.end(), 0);
    CHECK_CUDA(cudaMalloc(&d_seq, copies * 4));
    CHECK_CUDA(cudaMemcpy(d_seq, seqs.data(), copies * 4, cudaMemcpyHostToDevice));
    const int32_t len = static_cast<int32_t>(ctx);
    CHECK_CUDA(cudaMalloc(&d_len, 4));
    CHECK_CUDA(cudaMemcpy(d_len, &len, 4, cudaMemcpyHostToDevice));
    float* q = device_random<float>(heads * row, 9);
    float* out = nullptr;
    CHECK_CUDA(cudaMalloc(&out, heads * 512 * 4));
    const int best = kiln::cuda::mla_decode_num_splits(1, heads, ctx, prop.multiProcessorCount);
    for (int splits : {2 * best, best, std::max(1, best / 2), std::max(1, best / 4)}) {
      void* ws = nullptr;
      CHECK_CUDA(cudaMalloc(&ws, std::max<size_t>(1, kiln::cuda::mla_decode_workspace_bytes(1, heads, splits))));
      kiln::cuda::MlaDecodeParams p;
      p.q = q;
      p.num_queries = 1;
      p.num_heads = heads;
      p.cache = cache;
      p.block_size = block;
      p.block_tables = d_tables;
      p.max_blocks = blocks;
      p.kv_len = d_len;
      p.scale = 1.0f / 16;
      p.out = out;
      p.num_splits = splits;
      p.workspace = ws;
      const float ms = median_ms(
          [&](int i) {
            p.query_seq = d_seq + (i % copies);
            CHECK_OK(kiln::cuda::mla_decode_bf16(p, nullptr));
          },
          100);
      const double bytes = double(ctx) * row * 2;
      std::printf("%8lld %7d %10.2f %10.2f %10.2f %7.1f%%\n", (long long)ctx, splits, ms * 1e3, bytes / bw * 1e6,
                  bytes / (ms * 1e-3) / 1e12, 100.0 * (bytes / bw) / (ms * 1e-3));
      CHECK_CUDA(cudaFree(ws));
      if (best == 1) break;
    }
    CHECK_CUDA(cudaFree(cache));
    CHECK_CUDA(cudaFree(d_tables));
    CHECK_CUDA(cudaFree(d_seq));
    CHECK_CUDA(cudaFree(d_len));
    CHECK_CUDA(cudaFree(q));
    CHECK_CUDA(cudaFree(out));
  }

}

// MLA decode with several query rows per sequence (speculative verification: row i of r sees ctx − (r − 1 − i)
// keys), 1 or 4 sequences, 4K / 32K context: each row its own CTA column ("per-row": the cache read once per
// row) vs row groups ("grouped": once per sequence). 10 back-to-back calls per event pair; cache copies rotated
// past the L2. Floor: the cache bytes of the sequences once ÷ the copy rate.
void bench_mla_rows(const cudaDeviceProp& prop, double bw) {
  const int64_t heads = 20, block = 64, row = 576;
  std::printf("\nMLA decode, rows per sequence, 10 calls per event pair (%lld heads, block %lld)\n", (long long)heads,
              (long long)block);
  std::printf("%5s %8s %5s %14s %14s %10s\n", "seqs", "context", "rows", "per-row us", "grouped us", "floor_us");
  for (int64_t seqs : {1, 4}) {
    for (int64_t ctx : {4096, 32768}) {
      const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t(300) << 20) / (seqs * ctx * row * 2)));
      const int64_t blocks = ctx / block;
      const int64_t tables_n = int64_t(copies) * seqs;  // copy k holds sequences k·seqs .. k·seqs + seqs − 1
      uint16_t* cache = device_random<uint16_t>(size_t(tables_n) * blocks * block * row, 7);
      std::vector<int32_t> tables(size_t(tables_n) * blocks);
      std::iota(tables.begin(), tables.end(), 0);
      std::shuffle(tables.begin(), tables.end(), std::mt19937_64(3));
      int32_t* d_tables = nullptr;
      CHECK_CUDA(cudaMalloc(&d_tables, tables.size() * 4));
      CHECK_CUDA(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
      for (int64_t rows : {1, 2, 4, 6}) {
        const int64_t nq = seqs * rows;
        std::vector<int32_t> seq_ids(size_t(copies) * nq), lens(nq);
        for (int k = 0; k < copies; ++k)
          for (int64_t q = 0; q < nq; ++q) seq_ids[k * nq + q] = static_cast<int32_t>(k * seqs + q / rows);
        for (int64_t q = 0; q < nq; ++q) lens[q] = static_cast<int32_t>(ctx - (rows - 1 - q % rows));
        const std::vector<int32_t> groups = kiln::cuda::mla_decode_row_groups(seq_ids.data(), nq);
        int32_t *d_seq, *d_len, *d_groups;
        CHECK_CUDA(cudaMalloc(&d_seq, seq_ids.size() * 4));
        CHECK_CUDA(cudaMemcpy(d_seq, seq_ids.data(), seq_ids.size() * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMalloc(&d_len, nq * 4));
        CHECK_CUDA(cudaMemcpy(d_len, lens.data(), nq * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMalloc(&d_groups, groups.size() * 4));
        CHECK_CUDA(cudaMemcpy(d_groups, groups.data(), groups.size() * 4, cudaMemcpyHostToDevice));
        float* q = device_random<float>(nq * heads * row, 9);
        float* out = nullptr;
        CHECK_CUDA(cudaMalloc(&out, nq * heads * 512 * 4));
        float us[2];
        for (int grouped = 0; grouped < 2; ++grouped) {
          const int splits =
              grouped ? kiln::cuda::mla_decode_grouped_num_splits(seqs, rows, heads, ctx, prop.multiProcessorCount)
                      : kiln::cuda::mla_decode_num_splits(nq, heads, ctx, prop.multiProcessorCount);
          void* ws = nullptr;
          CHECK_CUDA(cudaMalloc(&ws, std::max<size_t>(1, kiln::cuda::mla_decode_workspace_bytes(nq, heads, splits))));
          kiln::cuda::MlaDecodeParams p;
          p.q = q, p.num_queries = nq, p.num_heads = heads, p.cache = cache, p.block_size = block;
          p.block_tables = d_tables, p.max_blocks = blocks, p.kv_len = d_len, p.scale = 1.0f / 16, p.out = out;
          p.num_splits = splits, p.workspace = ws;
          if (grouped) p.row_groups = d_groups, p.num_groups = seqs, p.max_group_rows = rows;
          us[grouped] = 1e3f * median_ms_per_call(
                                   [&](int i) {
                                     p.query_seq = d_seq + (i % copies) * nq;
                                     CHECK_OK(kiln::cuda::mla_decode_bf16(p, nullptr));
                                   },
                                   10, 30);
          CHECK_CUDA(cudaFree(ws));
        }
        const double bytes = double(seqs) * ctx * row * 2;
        std::printf("%5lld %8lld %5lld %14.2f %14.2f %10.2f\n", (long long)seqs, (long long)ctx, (long long)rows, us[0],
                    us[1], bytes / bw * 1e6);
        for (void* ptr : {(void*)d_seq, (void*)d_len, (void*)d_groups, (void*)q, (void*)out}) CHECK_CUDA(cudaFree(ptr));
      }
      CHECK_CUDA(cudaFree(cache));
      CHECK_CUDA(cudaFree(d_tables));
    }
  }
}

// MLA decode as the runner calls it in batch-invariant steps (split_by_length, splits rounded up to 16): one
// layer's decode + combine + the runner's bf16 copy of o_lat, either the separate f32_to_bf16 launch ("fp32+cast")
// or the bf16 output of the last writer ("bf16 out"). 10 back-to-back calls per event pair (launches overlap as in
// a graph), median of 30; every row is its own sequence and the cache copies rotate past the L2. Floor: the rows'
// cache bytes once ÷ the copy rate.
void bench_mla_runner(double bw) {
  const int64_t heads = 20, block = 64, row = 576;
  std::printf("\nMLA decode as the runner calls it (split_by_length, %lld heads, block %lld), us per layer\n",
              (long long)heads, (long long)block);
  std::printf("%5s %8s %7s %12s %12s %10s\n", "rows", "context", "splits", "fp32+cast", "bf16 out", "floor_us");
  for (int64_t rows : {1, 16}) {
    for (int64_t ctx : {4096, 32768, 131072}) {
      const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t(600) << 20) / (rows * ctx * row * 2)));
      const int64_t blocks = ctx / block, seqs = int64_t(copies) * rows;
      uint16_t* cache = device_bf16(size_t(seqs) * blocks * block * row, 2.f, 7);
      std::vector<int32_t> tables(static_cast<size_t>(seqs * blocks)), seq_ids(static_cast<size_t>(seqs));
      const std::vector<int32_t> lens(static_cast<size_t>(rows), static_cast<int32_t>(ctx));
      std::iota(tables.begin(), tables.end(), 0);
      std::shuffle(tables.begin(), tables.end(), std::mt19937_64(3));
      std::iota(seq_ids.begin(), seq_ids.end(), 0);
      int32_t *d_tables, *d_seq, *d_len;
      CHECK_CUDA(cudaMalloc(&d_tables, tables.size() * 4));
      CHECK_CUDA(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMalloc(&d_seq, seq_ids.size() * 4));
      CHECK_CUDA(cudaMemcpy(d_seq, seq_ids.data(), seq_ids.size() * 4, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMalloc(&d_len, rows * 4));
      CHECK_CUDA(cudaMemcpy(d_len, lens.data(), rows * 4, cudaMemcpyHostToDevice));
      float* q = device_random<float>(rows * heads * row, 9);
      float* out = nullptr;
      uint16_t* out_bf = nullptr;
      CHECK_CUDA(cudaMalloc(&out, rows * heads * 512 * 4));
      CHECK_CUDA(cudaMalloc(&out_bf, rows * heads * 512 * 2));
      const int splits = static_cast<int>((kiln::cuda::mla_decode_length_splits(ctx) + 15) / 16 * 16);
      void* ws = nullptr;
      CHECK_CUDA(cudaMalloc(&ws, kiln::cuda::mla_decode_workspace_bytes(rows, heads, splits)));
      float us[2];
      for (int bf16_out = 0; bf16_out < 2; ++bf16_out) {
        kiln::cuda::MlaDecodeParams p;
        p.q = q, p.num_queries = rows, p.num_heads = heads, p.cache = cache, p.block_size = block;
        p.block_tables = d_tables, p.max_blocks = blocks, p.kv_len = d_len, p.scale = 1.0f / 16;
        p.num_splits = splits, p.split_by_length = true, p.workspace = ws;
        p.out = bf16_out ? nullptr : out;
        p.out_bf16 = bf16_out ? out_bf : nullptr;
        us[bf16_out] = 1e3f * median_ms_per_call(
                                  [&](int i) {
                                    p.query_seq = d_seq + (i % copies) * rows;
                                    CHECK_OK(kiln::cuda::mla_decode_bf16(p, nullptr));
                                    if (!bf16_out) CHECK_OK(kiln::cuda::f32_to_bf16(out, rows * heads * 512, out_bf, nullptr));
                                  },
                                  10, 30);
      }
      std::printf("%5lld %8lld %7d %12.2f %12.2f %10.2f\n", (long long)rows, (long long)ctx, splits, us[0], us[1],
                  double(rows) * ctx * row * 2 / bw * 1e6);
      for (void* ptr : {(void*)cache, (void*)d_tables, (void*)d_seq, (void*)d_len, (void*)q, (void*)out, (void*)out_bf, ws})
        CHECK_CUDA(cudaFree(ptr));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a redirected log even if the run is cut short
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  // Copy bandwidth (bytes read + written), the ceiling for everything below.
  const size_t copy_bytes = size_t(2) << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  const float copy_ms = median_ms([&](int) { CHECK_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); }, 20);
  const double bw = 2.0 * copy_bytes / (copy_ms * 1e-3);
  std::printf("d2d copy: %.3f ms for 2 GiB -> %.2f TB/s (read + write)\n", copy_ms, bw / 1e12);
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));

  // One argument names the only section to run ("moe_batched", "mla_rows", "skinny", "mla_prefill", "moe_prefill");
  // none runs them all.
  const std::string only = argc > 1 ? argv[1] : "";
  if (only == "moe_batched") {
    bench_moe_batched(prop, bw);
    return 0;
  }
  if (only == "skinny") {
    bench_skinny_decode(prop, bw);
    return 0;
  }
  if (only == "mla_prefill" || only == "moe_prefill") {  // beside the cuBLAS rate they report against
    cublasHandle_t blas = nullptr;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) std::exit(1);
    (only == "mla_prefill" ? bench_mla_prefill : bench_moe_prefill)(blas, cublas_reference_rate(blas));
    cublasDestroy(blas);
    return 0;
  }
  if (only == "mla_rows") {
    bench_mla_runner(bw);
    bench_mla_decode(prop, bw);
    bench_mla_rows(prop, bw);
    return 0;
  }

  bench_mla_runner(bw);
  bench_mla_decode(prop, bw);

  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  const double peak = cublas_reference_rate(blas);
  bench_mla_prefill(blas, peak);
  bench_moe_prefill(blas, peak);
  cublasDestroy(blas);
  bench_skinny_gemm(prop, bw);
  bench_skinny_decode(prop, bw);
  bench_route_group(bw);
  bench_invariant_decode_products(prop, bw);
  bench_moe_batched(prop, bw);
  bench_mla_rows(prop, bw);
  return 0;
}
