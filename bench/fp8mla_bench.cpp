// c1 decode attention over the KV cache, one query row, per layout and form, beside the device's copy bandwidth
// measured in the same run: the bf16 layout's tensor-core kernel (1,152-byte rows) and fp8_ds_mla's two forms
// (656-byte rows, plugin kv-fp8mla): `fp8_direct` (whole pages bulk-copied, e4m3 multiplied as fp16 — the default on
// sm_90+) and `fp8_widened` (the SDK's kernel over tiles widened to bf16 in shared memory). GLM-4.7-Flash shapes:
// 20 heads, latent 512 + rope 64, pages of 64 tokens shuffled; splits as the layouts plan them under batch
// invariance (split_by_length), every kernel given the merge counters the layouts give it. Each figure: one CUDA
// graph running the attention over enough distinct sequences' caches (≥ 512 MiB, so the 50 MiB L2 serves none of
// them), replayed; time per call = graph time ÷ calls. KILN_MLA_DECODE=sm90 measures the bf16 layout's Hopper
// kernel (kernels/cuda/mla_decode_sm90) instead of the mma.sync one.
// Effective bandwidth = the cache bytes of one row's context ÷ time per call.
// Usage: kiln_bench_fp8mla_bench [--contexts 4096,32768,131072] [--heads 20] [--forms bf16,fp8_direct,...]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_check.h"
#include "bench_graph_timing.h"
#include "fp8_mla_kernels.h"
#include "fp8_mla_row.h"
#include "kernels/cuda/mla_decode.h"
#include "kiln/cuda/mla_decode_plan.h"
#include "kiln/cuda/mla_decode_sync.h"

namespace {

constexpr int64_t kLatent = 512, kRope = 64, kBlock = 64;

// ms per call of `call(i)` for i = 0 .. calls − 1, captured in one graph.
template <class Fn>
float per_call_ms(cudaStream_t st, int calls, Fn&& call) {
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) call(i);
  CHECK_CUDA(cudaStreamEndCapture(st, &g));
  CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  const float ms = time_graph(exec, st) / calls;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  return ms;
}

// Copy bandwidth (bytes read + written) as kernel_bench measures it, the roofline RESULTS.md uses: the median of 20
// plain 2 GiB device-to-device copies. (A copy captured in a graph measures lower on the H200, ~2.8 TB/s.)
double copy_bandwidth(cudaStream_t st) {
  const size_t bytes = size_t{2} << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CHECK_CUDA(cudaMemsetAsync(src, 1, bytes, st));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 22; ++i) {
    CHECK_CUDA(cudaEventRecord(a, st));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
    CHECK_CUDA(cudaEventRecord(b, st));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * bytes / (ms[ms.size() / 2] * 1e-3);
}

// `copies` sequences of `ctx` tokens each: pages of every copy in one allocation, each copy's block table a shuffle
// of its own pages. Rows are valid codes (no e4m3 NaN, scales near what a normed latent gives).
struct Caches {
  void* pages = nullptr;
  int32_t* tables = nullptr;
  int32_t* seqs = nullptr;
  int64_t blocks = 0;
};

Caches make_caches(int64_t ctx, int copies, int64_t row_bytes, bool fp8) {
  Caches c;
  c.blocks = (ctx + kBlock - 1) / kBlock;
  const int64_t rows = c.blocks * kBlock;
  std::vector<uint8_t> host(static_cast<size_t>(rows * row_bytes));
  std::mt19937 rng(11);
  const kiln::fp8mla::RowGeometry geom{kLatent, kRope};
  std::vector<float> values(kLatent + kRope);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t r = 0; r < rows; ++r) {
    // A handful of distinct rows repeated: the kernels' work does not depend on the payload.
    if (r < 64) {
      for (float& v : values) v = normal(rng);
      if (fp8) {
        kiln::fp8mla::encode_row(geom, values.data(), host.data() + r * row_bytes);
      } else {
        uint16_t* dst = reinterpret_cast<uint16_t*>(host.data() + r * row_bytes);
        for (int64_t i = 0; i < kLatent + kRope; ++i) dst[i] = kiln::fp8mla::float_to_bf16(values[i]);
      }
    } else {
      std::memcpy(host.data() + r * row_bytes, host.data() + (r % 64) * row_bytes, static_cast<size_t>(row_bytes));
    }
  }
  CHECK_CUDA(cudaMalloc(&c.pages, host.size() * copies));
  for (int i = 0; i < copies; ++i)
    CHECK_CUDA(cudaMemcpy(static_cast<uint8_t*>(c.pages) + host.size() * i, host.data(), host.size(),
                          cudaMemcpyHostToDevice));
  std::vector<int32_t> tables(static_cast<size_t>(c.blocks * copies));
  for (int i = 0; i < copies; ++i) {
    auto first = tables.begin() + i * c.blocks;
    std::iota(first, first + c.blocks, static_cast<int32_t>(i * c.blocks));
    std::shuffle(first, first + c.blocks, rng);
  }
  CHECK_CUDA(cudaMalloc(&c.tables, tables.size() * 4));
  CHECK_CUDA(cudaMemcpy(c.tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> seqs(copies);
  std::iota(seqs.begin(), seqs.end(), 0);
  CHECK_CUDA(cudaMalloc(&c.seqs, seqs.size() * 4));
  CHECK_CUDA(cudaMemcpy(c.seqs, seqs.data(), seqs.size() * 4, cudaMemcpyHostToDevice));
  return c;
}

void free_caches(Caches& c) {
  cudaFree(c.pages);
  cudaFree(c.tables);
  cudaFree(c.seqs);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<int64_t> contexts = {4096, 32768, 131072};
  int64_t heads = 20;
  std::string forms = "bf16,fp8_direct,fp8_widened";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--contexts" && i + 1 < argc) contexts = parse_list(argv[++i], "fp8mla_bench");
    else if (a == "--heads" && i + 1 < argc) heads = parse_list(argv[++i], "fp8mla_bench").at(0);
    else if (a == "--forms" && i + 1 < argc) forms = argv[++i];
    else {
      std::fprintf(stderr, "usage: kiln_bench_fp8mla_bench [--contexts 4096,32768,131072] [--heads 20] "
                           "[--forms bf16,fp8_direct,fp8_widened]\n");
      return 2;
    }
  }
  for (size_t at = 0; at <= forms.size();) {  // every name in --forms must be a form this program measures
    const size_t end = std::min(forms.find(',', at), forms.size());
    const std::string name = forms.substr(at, end - at);
    if (name != "bf16" && name != "fp8_direct" && name != "fp8_widened") {
      std::fprintf(stderr, "kiln_bench_fp8mla_bench: --forms: unknown form '%s' (bf16, fp8_direct, fp8_widened)\n",
                   name.c_str());
      return 2;
    }
    at = end + 1;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const double bw = copy_bandwidth(st);
  std::printf("device: %s, %d SMs; d2d copy %.2f TB/s (read + write)\n", prop.name, prop.multiProcessorCount, bw / 1e12);
  std::printf("c1 MLA decode attention, %lld heads, latent %lld + rope %lld, pages of %lld\n", (long long)heads,
              (long long)kLatent, (long long)kRope, (long long)kBlock);
  std::printf("%8s %-12s %6s %9s %10s %8s %8s\n", "context", "form", "splits", "us", "cache MB", "TB/s", "%copy");

  const kiln::fp8mla::RowGeometry geom{kLatent, kRope};
  const int64_t fp8_row = geom.bytes(), bf16_row = 2 * (kLatent + kRope);
  float* q = nullptr;
  float* out = nullptr;
  CHECK_CUDA(cudaMalloc(&q, heads * (kLatent + kRope) * 4));
  CHECK_CUDA(cudaMalloc(&out, heads * kLatent * 4));
  {
    std::vector<float> hq(heads * (kLatent + kRope));
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.f, 0.1f);
    for (float& x : hq) x = normal(rng);
    CHECK_CUDA(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
  }
  int32_t* d_len = nullptr;
  CHECK_CUDA(cudaMalloc(&d_len, 4));
  kiln::cuda::MlaDecodeSync merge_counters(0);  // as the bf16 layout passes them: the merge may run in the grid
  for (int64_t ctx : contexts) {
    const int32_t len = static_cast<int32_t>(ctx);
    CHECK_CUDA(cudaMemcpy(d_len, &len, 4, cudaMemcpyHostToDevice));
    const int splits = static_cast<int>((kiln::cuda::mla_decode_length_splits(ctx) + 15) / 16 * 16);
    void* ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, kiln::cuda::mla_decode_workspace_bytes(1, heads, splits)));
    for (int form = 0; form < 3; ++form) {
      const bool fp8 = form > 0;
      const auto tc_form = form == 1 ? kiln::fp8mla::TcForm::kDirect : kiln::fp8mla::TcForm::kWidened;
      const char* name = form == 0 ? "bf16" : form == 1 ? "fp8_direct" : "fp8_widened";
      if (("," + forms + ",").find("," + std::string(name) + ",") == std::string::npos) continue;
      const int64_t row_bytes = fp8 ? fp8_row : bf16_row;
      const double bytes = double(ctx) * row_bytes;
      const int copies = static_cast<int>(std::max<double>(2, std::ceil((512.0 * (1 << 20)) / bytes)));
      Caches c = make_caches(ctx, copies, row_bytes, fp8);
      float ms = 0;
      if (!fp8) {
        kiln::cuda::MlaDecodeParams p;
        p.q = q, p.num_queries = 1, p.num_heads = heads, p.cache = c.pages, p.block_size = kBlock;
        p.block_tables = c.tables, p.max_blocks = c.blocks, p.kv_len = d_len, p.scale = 1.0f / 24, p.out = out;
        p.num_splits = splits, p.split_by_length = true, p.workspace = ws, p.sync = merge_counters.get();
        ms = per_call_ms(st, copies, [&](int i) {
          p.query_seq = c.seqs + i;
          CHECK_OK(kiln::cuda::mla_decode_bf16(p, st));
        });
      } else {
        kiln::fp8mla::AttendParams p;
        p.shape.latent = kLatent, p.shape.rope = kRope, p.shape.tiles = geom.tiles();
        p.shape.scales_offset = geom.scales_offset(), p.shape.rope_offset = geom.rope_offset(), p.shape.row_bytes = fp8_row;
        p.pages = static_cast<const uint8_t*>(c.pages), p.block_size = kBlock, p.q = q, p.num_queries = 1;
        p.num_heads = heads, p.block_tables = c.tables, p.max_blocks = c.blocks, p.kv_len = d_len, p.scale = 1.0f / 24;
        p.out = out, p.sync = merge_counters.get();
        if (form == 1 && !kiln::fp8mla::direct_attend_takes(p.shape, kBlock, 0, c.pages)) {
          std::printf("%8lld %-12s (not on this device)\n", (long long)ctx, name);
          free_caches(c);
          continue;
        }
        ms = per_call_ms(st, copies, [&](int i) {
          p.query_seq = c.seqs + i;
          if (const char* why = kiln::fp8mla::launch_tc_attend(p, splits, true, ws, st, tc_form)) {
            std::fprintf(stderr, "fp8 attention: %s\n", why);
            std::exit(1);
          }
        });
      }
      std::printf("%8lld %-12s %6d %9.2f %10.1f %8.2f %7.1f%%\n", (long long)ctx, name, splits, ms * 1e3, bytes / 1e6,
                  bytes / (ms * 1e-3) / 1e12, 100.0 * bytes / (ms * 1e-3) / bw);
      free_caches(c);
    }
    cudaFree(ws);
  }
  cudaFree(q);
  cudaFree(out);
  cudaFree(d_len);
  return 0;
}
