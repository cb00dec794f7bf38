// EXL3 (plugin quant-exl3) products on one GPU beside the device's copy bandwidth measured in the same run.
// Effective bandwidth = (trellis + suh/svh bytes) ÷ time per product, the figure of merit: a memory-bound
// kernel streams each weight byte once. Shapes: GLM-4.7-Flash experts (hidden 2048, moe_intermediate 1536) and
// GLM-5.3-Flash experts (hidden 4096, moe_intermediate 2048; specs/glm5-next.md §6), K = 2..6 (MCG codebook, dummy
// trellis words: the kernels' work does not depend on the payload), 1 / 4 / 16 / 64 rows.
// Each figure: one CUDA graph that runs the product over enough distinct matrices (≥ 256 MiB, so the 50 MiB L2 does not
// serve them), replayed; time per product = graph time ÷ matrices (kernel boundaries included: one launch per
// product). Then the routed experts of one decode token (one ExpertSet::run: every (token, expert) pair in one
// launch per projection), expert ids rotated across graph nodes.
// Copy bandwidth: cudaMemcpyAsync device → device of 1 GiB, counted as bytes read + bytes written.
// Usage: kiln_bench_exl3_bench [--bits 2,3,4,5,6] [--rows 1,4,16,64] [--products-only | --experts-only | --viterbi]
//   (the defaults are the full table; the options select a part of it, e.g. for a profiler run)
// --viterbi: the encoder's trellis search instead (`kiln quantize`'s cost): tiles per second on the GPU
//   (cuda::viterbi_tiles over 16,384 random tiles, host to host, transfers included; codebook values read from the
//   table, then decoded in registers as the quantizer runs it) and on this machine's CPU threads (viterbi_tile under
//   OpenMP over 16 tiles a thread), the same tiles' first ones compared bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <omp.h>

#include <chrono>

#include "exl3_cuda_format.h"
#include "exl3_encoder.h"
#include "exl3_viterbi.h"
#include "exl3_viterbi_cuda.h"
#include "runtime/cuda/cuda_device_context.h"
#include "bench_check.h"
#include "bench_graph_timing.h"

namespace {


class SyntheticSource : public kiln::WeightSource {
 public:
  bool has(const std::string&) const override { return true; }
  kiln::Result<kiln::TensorView> get(const std::string& name) const override { return kiln::not_found(name); }
  bool synthetic() const override { return true; }
  uint64_t seed() const override { return 42; }
};

size_t weight_bytes(int64_t in, int64_t out, int bits) {
  const int64_t k = (in + 127) / 128 * 128, n = (out + 127) / 128 * 128;
  return static_cast<size_t>(k * n * bits / 8) + static_cast<size_t>(k + n) * 4;  // trellis + fp32 suh/svh
}

double copy_bandwidth(cudaStream_t st) {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CHECK_CUDA(cudaMemsetAsync(src, 1, bytes, st));
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
  CHECK_CUDA(cudaStreamEndCapture(st, &g));
  CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  const float ms = time_graph(exec, st);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

struct Shape {
  const char* model;
  const char* what;
  int64_t in, out;
};

bool wanted(const std::vector<int64_t>& list, int64_t v) { return std::find(list.begin(), list.end(), v) != list.end(); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The trellis search's rate, GPU against this machine's CPU threads, MUL1 codebook, Gaussian targets.
int viterbi_rates(const std::vector<int64_t>& bits_list) {
  const std::vector<float>& values = kiln::exl3::codebook_values(kiln::exl3::Codebook::kMul1);
  const int threads = omp_get_max_threads();
  std::printf("trellis search (MUL1), GPU: 16,384 tiles per K; CPU: %d threads x 16 tiles\n", threads);
  std::printf("%2s %18s %14s %14s %8s\n", "K", "GPU table tiles/s", "GPU tiles/s", "CPU tiles/s", "GPU/CPU");
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t bits : bits_list) {
    if (bits < 2 || bits > 8) continue;
    const int64_t tiles = 16384, cpu_tiles = 16 * threads;
    std::vector<float> t(static_cast<size_t>(tiles * 256));
    for (float& x : t) x = normal(rng);
    std::vector<uint8_t> gpu(static_cast<size_t>(tiles * 256)), cpu(static_cast<size_t>(cpu_tiles * 256));
    const std::string warm = kiln::exl3::cuda::viterbi_tiles(t.data(), 64, static_cast<int>(bits), values.data(),
                                                             gpu.data(), nullptr);
    if (!warm.empty()) {
      std::fprintf(stderr, "%s\n", warm.c_str());
      return 1;
    }
    auto t0 = std::chrono::steady_clock::now();
    std::string e = kiln::exl3::cuda::viterbi_tiles(t.data(), tiles, static_cast<int>(bits), values.data(), gpu.data(),
                                                    nullptr);
    const double table_s = seconds_since(t0);
    std::vector<uint8_t> decoded(gpu.size());
    t0 = std::chrono::steady_clock::now();
    if (e.empty())
      e = kiln::exl3::cuda::viterbi_tiles(t.data(), tiles, static_cast<int>(bits), values.data(), decoded.data(),
                                          nullptr, static_cast<int>(kiln::exl3::Codebook::kMul1));
    const double gpu_s = seconds_since(t0);
    if (!e.empty()) {
      std::fprintf(stderr, "%s\n", e.c_str());
      return 1;
    }
    t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < cpu_tiles; ++i) {
      thread_local kiln::exl3::ViterbiWorkspace ws;
      kiln::exl3::viterbi_tile(t.data() + i * 256, static_cast<int>(bits), values.data(), ws, cpu.data() + i * 256);
    }
    const double cpu_s = seconds_since(t0);
    const bool same = std::equal(cpu.begin(), cpu.end(), gpu.begin()) && gpu == decoded;
    std::printf("%2lld %18.0f %14.0f %14.1f %7.1fx%s\n", static_cast<long long>(bits), tiles / table_s, tiles / gpu_s,
                cpu_tiles / cpu_s, (tiles / gpu_s) / (cpu_tiles / cpu_s), same ? "" : "  (symbols DIFFER)");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> bits_list = {2, 3, 4, 5, 6}, rows_list = {1, 4, 16, 64};
  bool products = true, experts = true, viterbi = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bits" && i + 1 < argc) bits_list = parse_list(argv[++i], "exl3_bench");
    else if (a == "--rows" && i + 1 < argc) rows_list = parse_list(argv[++i], "exl3_bench");
    else if (a == "--products-only") experts = false;
    else if (a == "--experts-only") products = false;
    else if (a == "--viterbi") viterbi = true;
    else {
      std::fprintf(stderr,
                   "usage: kiln_bench_exl3_bench [--bits L] [--rows L] [--products-only | --experts-only | --viterbi]\n");
      return 2;
    }
  }
  if (viterbi) return viterbi_rates(bits_list);
  auto made = kiln::cuda::CudaDeviceContext::create();
  CHECK_OK(made.status());
  auto& dev = **made;
  const cudaStream_t st = dev.cuda_stream();
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbs = copy_bandwidth(st);
  std::printf("device: %s, %d SMs; D2D copy (read + write): %.0f GB/s\n", prop.name, prop.multiProcessorCount, copy_gbs);
  std::printf("%-14s %-8s %5s %5s %2s %5s %10s %10s %8s\n", "model", "proj", "in", "out", "K", "rows", "us/product",
              "eff GB/s", "of copy");

  const Shape shapes[] = {{"GLM-4.7-Flash", "gate/up", 2048, 1536},
                          {"GLM-4.7-Flash", "down", 1536, 2048},
                          {"GLM-5.3-Flash", "gate/up", 4096, 2048},
                          {"GLM-5.3-Flash", "down", 2048, 4096}};
  SyntheticSource source;
  std::mt19937 rng(1);
  for (const Shape& s : products ? shapes : std::span<const Shape>{}) {
    for (int bits = 2; bits <= 6; ++bits) {
      if (!wanted(bits_list, bits)) continue;
      auto format = kiln::exl3::cuda::make_cuda_weight_format(dev, nullptr, {bits, false});
      const size_t bytes = weight_bytes(s.in, s.out, bits);
      const int count = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes + 1, 8, 512));
      std::vector<std::unique_ptr<kiln::Linear>> linears;
      for (int i = 0; i < count; ++i) {
        kiln::LinearSpec spec{{std::string(s.model) + s.what + std::to_string(bits) + "." + std::to_string(i)},
                              {s.out}, s.in};
        auto l = format->load_linear(source, spec);
        CHECK_OK(l.status());
        linears.push_back(std::move(*l));
      }
      for (int64_t rows : rows_list) {
        std::vector<uint16_t> xh(static_cast<size_t>(rows * s.in));
        for (auto& v : xh) v = static_cast<uint16_t>(0x3C00 + (rng() & 0x3FF)) ^ (rng() & 0x8000);  // bf16 in ±[1, 2)
        void *x = nullptr, *y = nullptr, *ws = nullptr;
        const size_t ws_bytes = linears[0]->workspace_bytes(rows, kiln::Epilogue::kNone);
        CHECK_CUDA(cudaMalloc(&x, xh.size() * 2));
        CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(rows * s.out) * 2));
        CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
        CHECK_CUDA(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
        kiln::LinearRun r;
        r.x = kiln::TensorView::contiguous(x, kiln::DType::kBF16, {rows, s.in}, dev.device());
        r.y = kiln::TensorView::contiguous(y, kiln::DType::kBF16, {rows, s.out}, dev.device());
        r.workspace = ws, r.workspace_bytes = ws_bytes;
        cudaGraph_t g;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (auto& l : linears) CHECK_OK(l->run(r, dev.stream()));
        CHECK_CUDA(cudaStreamEndCapture(st, &g));
        CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
        const double us = time_graph(exec, st) * 1e3 / count;
        const double gbs = bytes / (us * 1e-6) / 1e9;
        std::printf("%-14s %-8s %5ld %5ld %2d %5ld %10.2f %10.0f %7.1f%%\n", s.model, s.what, static_cast<long>(s.in),
                    static_cast<long>(s.out), bits, static_cast<long>(rows), us, gbs, 100.0 * gbs / copy_gbs);
        std::fflush(stdout);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
        cudaFree(x);
        cudaFree(y);
        cudaFree(ws);
      }
    }
  }

  // One decode token through a layer's routed experts (ExpertSet::run), ids rotated across the graph's nodes.
  struct Moe {
    const char* model;
    int64_t experts, top_k, hidden, inter;
  };
  std::printf("\n%-14s %7s %5s %2s %14s %10s %8s\n", "model", "experts", "top_k", "K", "us/token-layer", "eff GB/s",
              "of copy");
  const Moe moes[] = {Moe{"GLM-4.7-Flash", 64, 4, 2048, 1536}, Moe{"GLM-5.3-Flash", 288, 8, 4096, 2048}};
  for (const Moe& m : experts ? moes : std::span<const Moe>{}) {
    for (int bits : {3, 4, 6}) {
      if (!wanted(bits_list, bits)) continue;
      auto format = kiln::exl3::cuda::make_cuda_weight_format(dev, nullptr, {bits, false});
      auto set = format->load_experts(source, kiln::ExpertSpec{std::string(m.model) + ".experts" + std::to_string(bits),
                                                               m.experts, m.hidden, m.inter});
      CHECK_OK(set.status());
      const int nodes = 64;
      std::vector<int32_t> ids(static_cast<size_t>(nodes * m.top_k));
      for (int n = 0; n < nodes; ++n) {
        std::vector<int32_t> all(static_cast<size_t>(m.experts));
        for (int64_t e = 0; e < m.experts; ++e) all[e] = static_cast<int32_t>(e);
        std::shuffle(all.begin(), all.end(), rng);
        std::copy_n(all.begin(), m.top_k, ids.begin() + n * m.top_k);
      }
      std::vector<float> weights(ids.size(), 0.25f);
      std::vector<uint16_t> xh(static_cast<size_t>(m.hidden), 0x3F80);
      void *x, *id, *w, *out, *ws;
      const size_t ws_bytes = (*set)->workspace_bytes(1, static_cast<int>(m.top_k));
      CHECK_CUDA(cudaMalloc(&x, xh.size() * 2));
      CHECK_CUDA(cudaMalloc(&id, ids.size() * 4));
      CHECK_CUDA(cudaMalloc(&w, weights.size() * 4));
      CHECK_CUDA(cudaMalloc(&out, static_cast<size_t>(m.top_k * m.hidden) * 4));
      CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
      CHECK_CUDA(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(id, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(w, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice));
      cudaGraph_t g;
      cudaGraphExec_t exec;
      CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int n = 0; n < nodes; ++n) {
        kiln::ExpertRun r;
        r.x = kiln::TensorView::contiguous(x, kiln::DType::kBF16, {1, m.hidden}, dev.device());
        r.routing.top_k = static_cast<int>(m.top_k);
        r.routing.ids = static_cast<const int32_t*>(id) + n * m.top_k;
        r.routing.weights = static_cast<const float*>(w) + n * m.top_k;
        r.pair_out = static_cast<float*>(out), r.workspace = ws, r.workspace_bytes = ws_bytes;
        CHECK_OK((*set)->run(r, dev.stream()).status());
      }
      CHECK_CUDA(cudaStreamEndCapture(st, &g));
      CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
      const double us = time_graph(exec, st) * 1e3 / nodes;
      const double bytes = static_cast<double>(m.top_k) * (2 * weight_bytes(m.hidden, m.inter, bits) +
                                                           weight_bytes(m.inter, m.hidden, bits));
      const double gbs = bytes / (us * 1e-6) / 1e9;
      std::printf("%-14s %7ld %5ld %2d %14.2f %10.0f %7.1f%%\n", m.model, static_cast<long>(m.experts),
                  static_cast<long>(m.top_k), bits, us, gbs, 100.0 * gbs / copy_gbs);
      std::fflush(stdout);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
      for (void* p : {x, id, w, out, ws}) cudaFree(p);
    }
  }
  return 0;
}
