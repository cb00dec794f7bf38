// The dense GEMMs of a GLM-4.7-Flash prefill chunk, one by one: what cuBLAS's default (cublasGemmEx, as the model
// runs them, with the model's output types) takes, and every algorithm cuBLASLt's heuristic offers for the same problem (up to 16), with its tile,
// stages, split-k and the heuristic's wave count — to see where the default leaves SMs idle (a narrow output: few
// tiles, a second wave mostly empty) and what another algorithm would give. Timing only; nothing here changes a
// model's choice. Usage: kiln_bench_prefill_gemm_bench [tokens ...]   (default 4096 8192)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_check.h"

namespace {

template <class Fn>
float median_ms(Fn&& fn, int iters) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    fn();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void* device_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> host(n);
  std::mt19937_64 rng(seed);
  for (auto& v : host) v = static_cast<uint16_t>(0x3c00 + (rng() % 0x600) - 0x300 + ((rng() & 1) << 15));
  void* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * 2));
  CHECK_CUDA(cudaMemcpy(d, host.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}

struct Problem {
  const char* name;
  int64_t out, in;     // y[tokens, out] = x[tokens, in] · Wᵀ
  bool f32_out;        // fp32 output (the gate's logits)
};

void run(cublasHandle_t blas, cublasLtHandle_t lt, const Problem& p, int64_t tokens, double peak) {
  void* w = device_bf16(size_t(p.out) * p.in, 1);
  void* x = device_bf16(size_t(tokens) * p.in, 2);
  void* y = nullptr;
  CHECK_CUDA(cudaMalloc(&y, size_t(tokens) * p.out * (p.f32_out ? 4 : 2)));
  const size_t ws_bytes = size_t(32) << 20;
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  const cudaDataType_t yt = p.f32_out ? CUDA_R_32F : CUDA_R_16BF;
  const float one = 1.f, zero = 0.f;
  const double flops = 2.0 * tokens * p.out * p.in;
  const int iters = 20;
  auto line = [&](const std::string& what, float ms) {
    std::printf("%-24s %6lld %-44s %9.1f %7.1f%%\n", p.name, (long long)tokens, what.c_str(), ms * 1e3,
                100.0 * flops / (ms * 1e-3) / peak);
  };
  const float def = median_ms(
      [&] {
        if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, p.out, tokens, p.in, &one, w, CUDA_R_16BF, p.in, x, CUDA_R_16BF,
                         p.in, &zero, y, yt, p.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
          std::exit(2);
      },
      iters);
  line("cublasGemmEx default", def);

  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n));
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, p.in, p.out, p.in);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, p.in, tokens, p.in);
  cublasLtMatrixLayoutCreate(&ld, yt, p.out, tokens, p.out);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t res[16];
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 16, res, &found);
  for (int i = 0; i < found; ++i) {
    int tile = 0, stages = 0, splitk = 0, cta_swizzle = 0;
    size_t sz = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &cta_swizzle,
                                         sizeof(cta_swizzle), &sz);
    bool failed = false;
    const float ms = median_ms(
        [&] {
          if (cublasLtMatmul(lt, desc, &one, w, la, x, lb, &zero, y, ld, y, ld, &res[i].algo, ws, ws_bytes, nullptr) !=
              CUBLAS_STATUS_SUCCESS)
            failed = true;
        },
        iters);
    char what[96];
    std::snprintf(what, sizeof(what), "lt #%d tile %d st %d splitk %d waves %.2f ws %zuK%s", i, tile, stages, splitk,
                  res[i].wavesCount, res[i].workspaceSize >> 10, failed ? " FAILED" : "");
    line(what, ms);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto l : {la, lb, ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  for (void* ptr : {w, x, y, ws}) CHECK_CUDA(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<int64_t> token_counts;
  for (int i = 1; i < argc; ++i) token_counts.push_back(std::atoll(argv[i]));
  if (token_counts.empty()) token_counts = {4096, 8192};
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
  // The reference rate: an 8192³ bf16 GEMM, as kernel_bench's prefill sections.
  void *a = device_bf16(size_t(8192) * 8192, 3), *b = device_bf16(size_t(8192) * 8192, 4), *c = nullptr;
  CHECK_CUDA(cudaMalloc(&c, size_t(8192) * 8192 * 2));
  const float one = 1.f, zero = 0.f;
  const float ref_ms = median_ms(
      [&] {
        cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, 8192, 8192, 8192, &one, a, CUDA_R_16BF, 8192, b, CUDA_R_16BF, 8192,
                     &zero, c, CUDA_R_16BF, 8192, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      },
      10);
  const double peak = 2.0 * 8192.0 * 8192.0 * 8192.0 / (ref_ms * 1e-3);
  for (void* ptr : {a, b, c}) CHECK_CUDA(cudaFree(ptr));
  std::printf("device: %s, %d SMs; cuBLAS bf16 8192^3: %.1f TFLOP/s (the %% column's reference)\n", prop.name,
              prop.multiProcessorCount, peak / 1e12);
  std::printf("%-24s %6s %-44s %9s %8s\n", "GEMM", "tokens", "how", "us", "%cublas");
  // GLM-4.7-Flash (hidden 2048, q_lora 768, kv 512 + 64, 20 heads × (192 + 64) q / 256 v, experts 64, inter 1536).
  const Problem problems[] = {
      // q_a + kv_a and q_b as the model runs them: fp32 output (cuda_attention_block.cpp); and in bf16, for scale.
      {"q_a + kv_a, fp32 out", 768 + 576, 2048, true}, {"q_b, fp32 out", 20 * 256, 768, true},
      {"q_a + kv_a", 768 + 576, 2048, false},   {"q_b", 20 * 256, 768, false},
      {"o_proj", 2048, 20 * 256, false},        {"shared gate_up", 2 * 1536, 2048, false},
      {"shared down", 2048, 1536, false},       {"gate, 3 bf16 terms", 3 * 64, 2048, true},
      {"gate, 1 bf16 term", 64, 2048, true},
  };
  for (int64_t tokens : token_counts)
    for (const Problem& p : problems) run(blas, lt, p, tokens, peak);
  cublasLtDestroy(lt);
  cublasDestroy(blas);
  return 0;
}
