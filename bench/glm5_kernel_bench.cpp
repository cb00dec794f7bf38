// GLM-5.3-Flash block kernels on one GPU beside their floors: KDA decode (fused recurrent step, state slots),
// KDA prefill (conv, chunked tf32 tensor-core kernel, RMSNormGated), mHC (maps + collapse, mix) and the pooled
// indexer (scores, selection). Times are CUDA-event medians; small kernels are timed as batches of back-to-back
// calls (per-call figure), and inputs / state slots / weights are rotated so the L2 does not serve them.
// Usage: kiln_bench_glm5_kernel_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/kda.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/pooled_indexer.h"
#include "bench_check.h"

namespace {


constexpr int64_t kH = 64, kD = 128, kDim = 4096;

template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> rand_f32(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> rand_bf16(size_t n, uint64_t seed, float bound) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-bound, bound);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = d(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    x = static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
  }
  return v;
}

template <class Fn>
float median_ms(Fn&& fn, int iters, int warm = 3) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) fn(i);
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    fn(warm + i);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CHECK_CUDA(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class Fn>
float median_ms_per_call(Fn&& fn, int reps, int iters) {
  return median_ms([&](int i) { for (int r = 0; r < reps; ++r) fn(i * reps + r); }, iters) / reps;
}

// ---- KDA decode: B sequences × `tokens` tokens, 128 slots rotated.
void bench_kda_decode(double bw) {
  const int64_t slots = 128, slot_bytes = kiln::cuda::kda_state_slot_bytes(kH);
  char* state = nullptr;
  CHECK_CUDA(cudaMalloc(&state, slots * slot_bytes));
  {
    const std::vector<float> s = rand_f32(size_t(slot_bytes / 4), 1, -0.1f, 0.1f);
    for (int64_t i = 0; i < slots; ++i)
      CHECK_CUDA(cudaMemcpy(state + i * slot_bytes, s.data(), slot_bytes, cudaMemcpyHostToDevice));
  }
  const int64_t C = 3 * kH * kD;
  float* conv_w = upload(rand_f32(size_t(C * 4), 2, -0.5f, 0.5f));
  float* a_log = upload(rand_f32(kH, 3, -1.f, 1.f));
  float* dt = upload(rand_f32(kH * kD, 4, -0.5f, 0.5f));
  float* nw = upload(rand_f32(kD, 5, 0.5f, 1.5f));
  std::printf("\nKDA decode (H 64, dk = dv 128, fp32 state 4 MiB per sequence; fused conv + gate + norm + delta rule +"
              " RMSNormGated, one launch)\n");
  std::printf("| seqs | tokens | µs per call | MB moved | GB/s | %% of copy |\n|---|---|---|---|---|---|\n");
  for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 1}, {4, 1}, {16, 1}, {32, 1}, {64, 1}, {16, 4}, {64, 4}}) {
    const int64_t sets = slots / B;
    std::vector<int32_t> ids(static_cast<size_t>(slots));
    for (int64_t i = 0; i < slots; ++i) ids[i] = int32_t((i * 37) % slots);
    int32_t* d_ids = upload(ids);
    uint16_t* qkv = upload(rand_bf16(size_t(B * T * C), 6, 2.f));
    float* g = upload(rand_f32(size_t(B * T * kH * kD), 7, -3.f, 3.f));
    float* bl = upload(rand_f32(size_t(B * T * kH), 8, -3.f, 3.f));
    float* gate = upload(rand_f32(size_t(B * T * kH * kD), 9, -3.f, 3.f));
    uint16_t* out = nullptr;
    CHECK_CUDA(cudaMalloc(&out, B * T * kH * kD * 2));
    kiln::cuda::KdaDecodeParams p;
    p.qkv = qkv, p.conv_weight = conv_w, p.g = g, p.beta_logits = bl, p.gate = gate, p.norm_weight = nw;
    p.forget.a_log = a_log, p.forget.dt_bias = dt;
    p.num_seqs = B, p.tokens = T, p.heads = kH, p.out_bf16 = out;
    const float ms = median_ms_per_call(
        [&](int i) {
          p.slots = {state, slot_bytes, d_ids + (i % sets) * B};
          CHECK_OK(kiln::cuda::kda_decode(p, nullptr));
        },
        20, 30);
    // state read + write, conv state read + write, inputs, output.
    const double bytes = double(B) * (2.0 * slot_bytes + T * (C * 2 + kH * kD * 4 * 2 + kH * 4 + kH * kD * 2));
    std::printf("| %ld | %ld | %.2f | %.1f | %.0f | %.1f %% |\n", long(B), long(T), ms * 1e3, bytes / 1e6,
                bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / bw);
    CHECK_CUDA(cudaFree(d_ids));
    CHECK_CUDA(cudaFree(qkv));
    CHECK_CUDA(cudaFree(g));
    CHECK_CUDA(cudaFree(bl));
    CHECK_CUDA(cudaFree(gate));
    CHECK_CUDA(cudaFree(out));
  }
  CHECK_CUDA(cudaFree(state));
  for (void* q : {static_cast<void*>(conv_w), static_cast<void*>(a_log), static_cast<void*>(dt), static_cast<void*>(nw)})
    CHECK_CUDA(cudaFree(q));
}

// ---- KDA prefill: conv, chunked kernel, RMSNormGated over `total` tokens in `seqs` equal sequences.
void bench_kda_prefill(double bw) {
  const int64_t C = 3 * kH * kD, slot_bytes = kiln::cuda::kda_state_slot_bytes(kH);
  std::printf("\nKDA prefill (H 64; chunked = 3xTF32 mma.sync (the default), C 64; FLOPs = 9.2 M per chunk per head,"
              " the products of the WY form, counted once; beside it the single-tf32 form)\n");
  std::printf("| seqs × tokens | conv µs (GB/s) | chunked µs | TFLOP/s | Mtok/s | single tf32 µs | gated norm µs (GB/s) |"
              " recurrent fallback µs |\n|---|---|---|---|---|---|---|---|\n");
  float* conv_w = upload(rand_f32(size_t(C * 4), 2, -0.5f, 0.5f));
  float* a_log = upload(rand_f32(kH, 3, -1.f, 1.f));
  float* dt = upload(rand_f32(kH * kD, 4, -0.5f, 0.5f));
  float* nw = upload(rand_f32(kD, 5, 0.5f, 1.5f));
  for (auto [seqs, len] : {std::pair<int64_t, int64_t>{1, 4096}, {4, 1024}, {1, 16384}, {8, 2048}}) {
    const int64_t total = seqs * len;
    char* state = nullptr;
    CHECK_CUDA(cudaMalloc(&state, seqs * slot_bytes));
    {
      const std::vector<float> s = rand_f32(size_t(slot_bytes / 4), 1, -0.1f, 0.1f);
      for (int64_t i = 0; i < seqs; ++i)
        CHECK_CUDA(cudaMemcpy(state + i * slot_bytes, s.data(), slot_bytes, cudaMemcpyHostToDevice));
    }
    std::vector<int32_t> cu(static_cast<size_t>(seqs + 1)), ids(static_cast<size_t>(seqs));
    for (int64_t s = 0; s <= seqs; ++s) cu[s] = int32_t(s * len);
    for (int64_t s = 0; s < seqs; ++s) ids[s] = int32_t(s);
    int32_t* d_cu = upload(cu);
    int32_t* d_ids = upload(ids);
    uint16_t *pre = upload(rand_bf16(size_t(total * C), 6, 2.f)), *conv = nullptr;
    CHECK_CUDA(cudaMalloc(&conv, total * C * 2));
    float* g = upload(rand_f32(size_t(total * kH * kD), 7, -3.f, 3.f));
    float* bl = upload(rand_f32(size_t(total * kH), 8, -3.f, 3.f));
    float* gate = upload(rand_f32(size_t(total * kH * kD), 9, -3.f, 3.f));
    float* o = nullptr;
    uint16_t* y = nullptr;
    CHECK_CUDA(cudaMalloc(&o, total * kH * kD * 4));
    CHECK_CUDA(cudaMalloc(&y, total * kH * kD * 2));
    const kiln::cuda::KdaStateSlots slots{state, slot_bytes, d_ids};
    const float conv_ms = median_ms(
        [&](int) { CHECK_OK(kiln::cuda::kda_conv_prefill(pre, conv_w, d_cu, seqs, total, kH, slots, conv, nullptr)); }, 10);
    kiln::cuda::KdaPrefillParams p;
    p.qkv = conv, p.g = g, p.beta_logits = bl, p.forget.a_log = a_log, p.forget.dt_bias = dt, p.slots = slots;
    p.cu_seqlens = d_cu, p.num_seqs = seqs, p.total_tokens = total, p.heads = kH, p.out = o;
    const float chunk_ms = median_ms([&](int) { CHECK_OK(kiln::cuda::kda_prefill(p, nullptr)); }, 10);
    p.split_tf32 = false;
    const float tf32_ms = median_ms([&](int) { CHECK_OK(kiln::cuda::kda_prefill(p, nullptr)); }, 10);
    p.split_tf32 = true;
    const float norm_ms = median_ms(
        [&](int) { CHECK_OK(kiln::cuda::kda_gated_rmsnorm(o, gate, nw, total, kH, 1e-5f, nullptr, y, nullptr)); }, 10);
    float rec_ms = 0;
    if (total <= 4096) {
      p.forget.has_lower_bound = false;
      rec_ms = median_ms([&](int) { CHECK_OK(kiln::cuda::kda_prefill(p, nullptr)); }, 3, 1);
      p.forget.has_lower_bound = true;
    }
    const double chunks = double(seqs) * ((len + 63) / 64);
    const double flops = 9.2e6 * chunks * kH;
    const double conv_bytes = double(total) * C * 4, norm_bytes = double(total) * kH * kD * 10;
    std::printf("| %ld × %ld | %.1f (%.0f) | %.1f | %.1f | %.2f | %.1f | %.1f (%.0f) | %.0f |\n", long(seqs), long(len),
                conv_ms * 1e3, conv_bytes / (conv_ms * 1e-3) / 1e9, chunk_ms * 1e3, flops / (chunk_ms * 1e-3) / 1e12,
                total / (chunk_ms * 1e-3) / 1e6, tf32_ms * 1e3, norm_ms * 1e3, norm_bytes / (norm_ms * 1e-3) / 1e9, rec_ms * 1e3);
    for (void* q : {static_cast<void*>(state), static_cast<void*>(d_cu), static_cast<void*>(d_ids),
                    static_cast<void*>(pre), static_cast<void*>(conv), static_cast<void*>(g), static_cast<void*>(bl),
                    static_cast<void*>(gate), static_cast<void*>(o), static_cast<void*>(y)})
      CHECK_CUDA(cudaFree(q));
  }
  (void)bw;
}

// ---- mHC: maps + collapse and mix, D 4096, 4 fp32 streams, fn rotated over 64 copies (one per sub-layer).
void bench_mhc(double bw) {
  const int64_t F = 4 * kDim, copies = 64;
  float* fn = upload(rand_f32(size_t(24 * F), 1, -0.015f, 0.015f));
  std::vector<float*> fns(copies);
  for (auto& f : fns) {
    CHECK_CUDA(cudaMalloc(&f, 24 * F * 4));
    CHECK_CUDA(cudaMemcpy(f, fn, 24 * F * 4, cudaMemcpyDeviceToDevice));
  }
  float* base = upload(rand_f32(24, 2, -1.f, 1.f));
  float* scale = upload(rand_f32(3, 3, 0.5f, 2.f));
  std::printf("\nmHC (D 4096, 4 fp32 streams; maps+collapse reads x and fn 1.5 MiB, writes h bf16; mix reads x, y bf16,"
              " writes x)\n");
  std::printf("| tokens | maps+collapse µs | GB/s | mix µs | GB/s |\n|---|---|---|---|---|\n");
  for (int64_t n : {1, 16, 64, 4096}) {
    const int64_t sets = std::max<int64_t>(1, std::min<int64_t>(copies, (256ll << 20) / (n * F * 4)));
    float* x = upload(rand_f32(size_t(sets * n * F), 4, -2.f, 2.f));
    uint16_t* y = upload(rand_bf16(size_t(sets * n * kDim), 5, 2.f));
    float *pre, *post, *comb;
    uint16_t* h;
    CHECK_CUDA(cudaMalloc(&pre, sets * n * 16));
    CHECK_CUDA(cudaMalloc(&post, sets * n * 16));
    CHECK_CUDA(cudaMalloc(&comb, sets * n * 64));
    CHECK_CUDA(cudaMalloc(&h, sets * n * kDim * 2));
    const float maps_ms = median_ms_per_call(
        [&](int i) {
          kiln::cuda::MhcDeviceParams p;
          p.fn = fns[i % copies], p.base = base, p.scale = scale, p.dim = kDim;
          const int64_t s = i % sets;
          CHECK_OK(kiln::cuda::mhc_maps_collapse(x + s * n * F, n, p, pre + s * n * 4, post + s * n * 4,
                                                 comb + s * n * 16, nullptr, h + s * n * kDim, nullptr));
        },
        n >= 4096 ? 2 : 20, 20);
    const float mix_ms = median_ms_per_call(
        [&](int i) {
          const int64_t s = i % sets;
          CHECK_OK(kiln::cuda::mhc_mix(x + s * n * F, y + s * n * kDim, post + s * n * 4, comb + s * n * 16, n, kDim,
                                       nullptr));
        },
        n >= 4096 ? 2 : 20, 20);
    const double maps_bytes = 24.0 * F * 4 + n * (F * 4.0 + kDim * 2.0), mix_bytes = n * (2.0 * F * 4 + kDim * 2.0);
    std::printf("| %ld | %.2f | %.0f | %.2f | %.0f |\n", long(n), maps_ms * 1e3, maps_bytes / (maps_ms * 1e-3) / 1e9,
                mix_ms * 1e3, mix_bytes / (mix_ms * 1e-3) / 1e9);
    for (void* q : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(pre), static_cast<void*>(post),
                    static_cast<void*>(comb), static_cast<void*>(h)})
      CHECK_CUDA(cudaFree(q));
  }
  for (auto f : fns) CHECK_CUDA(cudaFree(f));
  CHECK_CUDA(cudaFree(fn));
  (void)bw;
}

// ---- Pooled indexer: scores + selection for t_q queries at the end of a context (32 heads, pool 16, top 2048).
void bench_pooled_indexer(double bw) {
  std::printf("\nPooled indexer (32 heads × 128, pool 16, index_topk 2048; keys fp32 rotated over 16 copies)\n");
  std::printf("| context | queries | scores µs | keys GB/s | select µs |\n|---|---|---|---|---|\n");
  for (auto [ctx, tq] : {std::pair<int64_t, int64_t>{4096, 1}, {131072, 1}, {131072, 16}, {8192, 4096}}) {
    const int64_t pools = ctx / 16, copies = 16;
    float* keys = upload(rand_f32(size_t(copies * pools * 128), 1, -1.f, 1.f));
    float* q = upload(rand_f32(size_t(tq * 32 * 128), 2, -1.f, 1.f));
    float* w = upload(rand_f32(size_t(tq * 32), 3, -0.2f, 0.2f));
    float* scores = nullptr;
    int32_t *ws = nullptr, *out = nullptr;
    CHECK_CUDA(cudaMalloc(&scores, tq * pools * 4));
    CHECK_CUDA(cudaMalloc(&ws, tq * 128 * 4));
    CHECK_CUDA(cudaMalloc(&out, tq * 2063 * 4));
    const int reps = tq >= 1024 ? 2 : 20;
    const float sc_ms = median_ms_per_call(
        [&](int i) {
          CHECK_OK(kiln::cuda::pooled_indexer_scores(q, w, keys + (i % copies) * pools * 128, tq, pools, 32,
                                                     1.f / std::sqrt(128.f), ctx - tq, 16, scores, nullptr));
        },
        reps, 20);
    const float sel_ms = median_ms_per_call(
        [&](int) {
          CHECK_OK(kiln::cuda::pooled_indexer_select(scores, tq, pools, ctx - tq, 16, 2048, true, ws, out, 2063,
                                                     nullptr));
        },
        reps, 20);
    std::printf("| %ld | %ld | %.2f | %.0f | %.2f |\n", long(ctx), long(tq), sc_ms * 1e3,
                pools * 512.0 / (sc_ms * 1e-3) / 1e9, sel_ms * 1e3);
    for (void* p : {static_cast<void*>(keys), static_cast<void*>(q), static_cast<void*>(w), static_cast<void*>(scores),
                    static_cast<void*>(ws), static_cast<void*>(out)})
      CHECK_CUDA(cudaFree(p));
  }
  (void)bw;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const size_t copy_bytes = size_t(2) << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  const float copy_ms =
      median_ms([&](int) { CHECK_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); }, 10);
  const double bw = 2.0 * copy_bytes / (copy_ms * 1e-3);
  std::printf("d2d copy: %.3f ms for 2 GiB -> %.2f TB/s (read + write)\n", copy_ms, bw / 1e12);
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  const std::string only = argc > 1 ? argv[1] : "";
  if (only.empty() || only == "kda_decode") bench_kda_decode(bw);
  if (only.empty() || only == "kda_prefill") bench_kda_prefill(bw);
  if (only.empty() || only == "mhc") bench_mhc(bw);
  if (only.empty() || only == "indexer") bench_pooled_indexer(bw);
  return 0;
}
