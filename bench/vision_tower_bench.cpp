// glm5_next's vision tower on one GPU (plugins/vision, CudaVisionTower, TF32 products) at GLM-5.3-Flash's vision
// shapes (specs/glm5-next.md §6: depth 24, hidden 1024, 16 heads, intermediate 4096, patch 14, merge 2,
// projection_intermediate 10240; out_hidden = the text model's 4096) with random weights: images per second through
// the encoder for square images of 336, 1024 and 2048 pixels (the processor's canvas decides patches and tokens), and
// the tower's part of a 16-image request (16 × 1024², encoded one after another as the modality does).
// Beside each figure: the FLOPs of the products (2·m·n·k per linear, 4·L²·hidden per frame for attention) and the
// rate that makes against the H200's dense TF32 tensor-core peak (495 TFLOP/s, NVIDIA's data sheet).
// Usage: kiln_bench_vision_tower_bench [--math fp32]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench_check.h"
#include "cuda/vision_flash_attention.h"
#include "cuda/vision_tower_cuda.h"
#include "image_canvas.h"
#include "vision_config.h"
#include "vision_weights.h"

namespace {

using kiln::vision::CudaVisionTower;
using kiln::vision::VisionConfig;
using kiln::vision::VisionWeights;

constexpr double kTf32PeakTflops = 495.0;

std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// FLOPs of one image of n patches in one frame through the tower.
double tower_flops(const VisionConfig& c, double n) {
  const double h = c.hidden_size, in = c.intermediate_size, out = c.out_hidden_size, pi = c.projection_intermediate_size;
  const double mm = c.spatial_merge_size * c.spatial_merge_size, tokens = n / mm;
  const double per_block = 2 * n * h * (3 * h + h + 3 * in) + 4 * n * n * h;
  return 2 * n * c.patch_dim() * h + c.depth * per_block + 2 * tokens * (mm * h * out + out * out + 3 * out * pi);
}

// The tower's attention alone for one frame of n patches: its 24 blocks' flash attention calls back to back, timed
// with CUDA events (ms for all 24, and the rate its 4·n²·hidden FLOPs per block make).
void time_attention(const VisionConfig& c, int64_t n, std::mt19937& rng) {
  const int64_t h = c.hidden_size, hd = c.head_dim(), heads = c.num_heads;
  const std::vector<float> qkv = random_vector(static_cast<size_t>(n * 3 * h), rng, 2.0f);
  float *d_qkv = nullptr, *d_out = nullptr;
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&d_qkv, qkv.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_out, static_cast<size_t>(n * h) * 4));
  CHECK_CUDA(cudaMalloc(&ws, kiln::vision::cuda::flash_attention_workspace_bytes(n, heads, hd)));
  CHECK_CUDA(cudaMemcpy(d_qkv, qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < 4; ++rep) {
    CHECK_CUDA(cudaEventRecord(a));
    for (int64_t blk = 0; blk < c.depth; ++blk)
      CHECK_CUDA(kiln::vision::cuda::flash_attention_frame(d_qkv, d_out, 0, n, heads, hd, scale, ws, nullptr));
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    if (rep > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double flops = c.depth * 4.0 * static_cast<double>(n) * n * h;
  std::printf("#   attention alone, %lld patches: %.1f ms for %lld blocks (%.0f TFLOP/s of bf16 products)\n",
              static_cast<long long>(n), ms[1], static_cast<long long>(c.depth), flops / (ms[1] * 1e-3) / 1e12);
  cudaEventDestroy(a), cudaEventDestroy(b);
  cudaFree(d_qkv), cudaFree(d_out), cudaFree(ws);
}

// The tower's linears of one frame of n patches (per block: qkv, proj, gate, up, down; ×24) as cuBLAS products the
// way the tower runs them (fp32 in and out, TF32 tensor cores) and the way a bf16 tower would (bf16 in, fp32 out,
// fp32 accumulation): what the products alone cost, beside attention, and what bf16 operands would gain.
void time_linears(const VisionConfig& c, int64_t n) {
  const int64_t h = c.hidden_size, in = c.intermediate_size;
  const int64_t shapes[5][2] = {{h, 3 * h}, {h, h}, {h, in}, {h, in}, {in, h}};  // {in, out}
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return;
  void *x = nullptr, *w = nullptr, *y = nullptr;
  CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(n * in) * 4));
  CHECK_CUDA(cudaMalloc(&w, static_cast<size_t>(in * h) * 4 * 3));
  CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(n * in) * 4));
  CHECK_CUDA(cudaMemset(x, 0, static_cast<size_t>(n * in) * 4));
  CHECK_CUDA(cudaMemset(w, 0, static_cast<size_t>(in * h) * 4 * 3));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
    std::vector<float> ms;
    double flops = 0;
    for (int rep = 0; rep < 4; ++rep) {
      CHECK_CUDA(cudaEventRecord(a));
      flops = 0;
      for (int64_t blk = 0; blk < c.depth; ++blk)
        for (const auto& sh : shapes) {
          const float one = 1.0f, zero = 0.0f;
          cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sh[1]), static_cast<int>(n),
                       static_cast<int>(sh[0]), &one, w, t, static_cast<int>(sh[0]), x, t, static_cast<int>(sh[0]),
                       &zero, y, CUDA_R_32F, static_cast<int>(sh[1]), compute, CUBLAS_GEMM_DEFAULT);
          flops += 2.0 * n * sh[0] * sh[1];
        }
      CHECK_CUDA(cudaEventRecord(b));
      CHECK_CUDA(cudaEventSynchronize(b));
      float v = 0;
      CHECK_CUDA(cudaEventElapsedTime(&v, a, b));
      if (rep > 0) ms.push_back(v);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("#   linears alone, %lld patches, %s: %.1f ms for %lld blocks (%.0f TFLOP/s)\n",
                static_cast<long long>(n), bf16 ? "bf16 operands" : "TF32 (fp32 operands)", ms[1],
                static_cast<long long>(c.depth), flops / (ms[1] * 1e-3) / 1e12);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  cudaFree(x), cudaFree(w), cudaFree(y);
  cublasDestroy(blas);
}

}  // namespace

int main(int argc, char** argv) {
  const bool fp32 = argc > 2 && std::strcmp(argv[1], "--math") == 0 && std::strcmp(argv[2], "fp32") == 0;
  VisionConfig c;  // the defaults are GLM-5.3-Flash's tower
  c.out_hidden_size = 4096;
  c.text_hidden_size = 4096;
  std::printf("# vision tower, GLM-5.3-Flash shapes (depth %lld, hidden %lld, %lld heads, intermediate %lld, out %lld), "
              "%s products, random weights\n",
              static_cast<long long>(c.depth), static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_heads),
              static_cast<long long>(c.intermediate_size), static_cast<long long>(c.out_hidden_size),
              fp32 ? "fp32" : "TF32");
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("# GPU: %s\n", prop.name);
  const VisionWeights w = kiln::vision::random_vision_weights(c, 7);
  auto tower = CudaVisionTower::create(c, w, 0, fp32 ? CudaVisionTower::Math::kFp32 : CudaVisionTower::Math::kTf32);
  CHECK_OK(tower.status());
  std::printf("# weights on the device: %.2f GiB (fp32)\n", static_cast<double>((*tower)->weight_bytes()) / (1 << 30));
  kiln::vision::ImageProcessorConfig pc;
  std::printf("| image | canvas | patches | tokens | ms / image | images / s | TFLOP/s | of TF32 peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(11);
  double ms_1024 = 0;
  for (int64_t side : {336, 1024, 2048}) {
    auto plan = kiln::vision::plan_canvas(side, side, pc);
    CHECK_OK(plan.status());
    const int64_t gh = plan->canvas_height / c.patch_size, gw = plan->canvas_width / c.patch_size, n = gh * gw;
    const std::vector<std::array<int64_t, 3>> grid = {{1, gh, gw}};
    const std::vector<float> pixels = random_vector(static_cast<size_t>(n * c.patch_dim()), rng, 1.0f);
    for (int i = 0; i < 2; ++i) CHECK_OK((*tower)->run(pixels, grid).status());  // buffers grown, clocks up
    const int reps = side <= 336 ? 20 : side <= 1024 ? 8 : 3;
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      CHECK_OK((*tower)->run(pixels, grid).status());  // synchronises: rows are on the host when it returns
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    if (side == 1024) ms_1024 = med;
    const double tflops = tower_flops(c, static_cast<double>(n)) / (med * 1e-3) / 1e12;
    std::printf("| %lld² | %lld×%lld | %lld | %lld | %.1f | %.2f | %.0f | %.0f %% |\n", static_cast<long long>(side),
                static_cast<long long>(plan->canvas_width), static_cast<long long>(plan->canvas_height),
                static_cast<long long>(n), static_cast<long long>(n / 4), med, 1000.0 / med, tflops,
                100.0 * tflops / kTf32PeakTflops);
  }
  for (int64_t side : {336, 1024, 2048}) {
    auto plan = kiln::vision::plan_canvas(side, side, pc);
    CHECK_OK(plan.status());
    const int64_t n = plan->canvas_height / c.patch_size * (plan->canvas_width / c.patch_size);
    time_attention(c, n, rng);
    time_linears(c, n);
  }
  std::printf("# 16 images of 1024² encoded one after another (the modality's order): %.0f ms of a 16-image request's "
              "TTFT is the tower\n",
              16 * ms_1024);
  {  // The same 16 images as 16 frames of one run: what encoding a request's images together would take.
    auto plan = kiln::vision::plan_canvas(1024, 1024, pc);
    CHECK_OK(plan.status());
    const int64_t gh = plan->canvas_height / c.patch_size, gw = plan->canvas_width / c.patch_size;
    const std::vector<std::array<int64_t, 3>> grids(16, {1, gh, gw});
    const std::vector<float> pixels = random_vector(static_cast<size_t>(16 * gh * gw * c.patch_dim()), rng, 1.0f);
    CHECK_OK((*tower)->run(pixels, grids).status());
    std::vector<double> ms;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      CHECK_OK((*tower)->run(pixels, grids).status());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("# 16 images of 1024² as 16 frames of one run: %.0f ms (%.2f× one after another)\n", ms[1],
                16 * ms_1024 / ms[1]);
  }
  return 0;
}
