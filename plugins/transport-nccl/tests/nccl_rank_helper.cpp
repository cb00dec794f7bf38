// One rank of the two-process GPU tests (started by rank_processes.h with RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT; every rank on cuda:0). Scenarios, by the first argument; the last is the output folder:
//   ipc                       the custom all-reduce, eager and in a CUDA graph, fp32 and bf16, one- and two-shot,
//                             checked against the host's rank-order sum; results appended to result<rank>.bin
//   probe <mode> <force>      choose_all_reduce with custom_all_reduce = mode (auto|on|off) and the forced failure
//                             on no rank, every rank or rank 1 only (none|all|rank1); prints the choice
//   collective                the `nccl` collective from the built plugin, two ranks on one GPU
//   moe                       the fused MoE sum + combine + residual add + RMSNorm against the custom all-reduce
//                             followed by the core's combine kernel, bit for bit, eager and graph-replayed, over
//                             shapes that take each row path; residual and normed rows appended to result<rank>.bin
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <fstream>
#include <string>
#include <vector>

#include "custom_all_reduce_probe.h"
#include "kernels/cuda/moe_experts.h"
#include "ipc_all_reduce.h"
#include "kiln/collective.h"
#include "kiln/launch_env.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "probe_pattern.h"
#include "kiln/tcp_bootstrap.h"

namespace kiln::nccl {
namespace {
namespace fs = std::filesystem;
using cuda::IpcAllReduce;

#define HELPER_CHECK_CUDA(expr)                                                                       \
  do {                                                                                                \
    const cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #expr); \
      return 2;                                                                                       \
    }                                                                                                 \
  } while (0)

Result<std::unique_ptr<TcpBootstrap>> connect_from_env(LaunchEnv& launch) {
  KILN_ASSIGN_OR_RETURN(launch, read_launch_env(process_env()));
  return TcpBootstrap::connect(rendezvous_spec(launch));
}

struct Case {
  DType dtype;
  IpcAllReduce::Algorithm algorithm;
  size_t bytes;
  bool graph;
};

const char* algo_name(IpcAllReduce::Algorithm a) {
  return a == IpcAllReduce::Algorithm::kTwoShot ? "two-shot" : "one-shot";
}

// This rank's bootstrap and its custom all-reduce with every peer's handle opened, on cuda:0; prints why not.
struct IpcRank {
  LaunchEnv launch;
  std::unique_ptr<TcpBootstrap> boot;
  std::unique_ptr<IpcAllReduce> ar;
};

bool open_ipc_rank(IpcRank& r) {
  auto boot = connect_from_env(r.launch);
  if (!boot.ok()) return std::printf("bootstrap: %s\n", boot.status().to_string().c_str()), false;
  r.boot = std::move(*boot);
  if (cudaError_t e = cudaSetDevice(0); e != cudaSuccess)
    return std::printf("cudaSetDevice: %s\n", cudaGetErrorString(e)), false;
  auto made = IpcAllReduce::create(r.launch.rank, r.launch.world_size);
  if (!made.ok()) return std::printf("create: %s\n", made.status().to_string().c_str()), false;
  r.ar = std::move(*made);
  auto handle = r.ar->export_handle();
  if (!handle.ok()) return std::printf("export: %s\n", handle.status().to_string().c_str()), false;
  auto handles = r.boot->all_gather(*handle);
  if (!handles.ok()) return std::printf("exchange: %s\n", handles.status().to_string().c_str()), false;
  if (Status st = r.ar->open_peers(*handles); !st.ok())
    return std::printf("open: %s\n", st.to_string().c_str()), false;
  return true;
}

int run_ipc(const fs::path& out_dir) {
  IpcRank rank;
  if (!open_ipc_rank(rank)) return 2;
  const LaunchEnv& launch = rank.launch;
  std::unique_ptr<IpcAllReduce>& ar = rank.ar;

  cudaStream_t stream;
  HELPER_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  char* buffer = nullptr;
  HELPER_CHECK_CUDA(cudaMalloc(&buffer, ar->capacity()));
  std::ofstream results(out_dir / ("result" + std::to_string(launch.rank) + ".bin"), std::ios::binary);
  int failures = 0, cases = 0;
  uint32_t seed = 1;

  // Inputs go in on `stream` (cudaMemcpyAsync): the stream is non-blocking, so it would not wait for the legacy
  // stream, and a pageable cudaMemcpy may return before its DMA lands. Results are read after a stream sync.
  auto check = [&](const Case& c, int64_t count, uint32_t case_seed, const char* how) {
    std::vector<char> got(c.bytes);
    cudaMemcpy(got.data(), buffer, c.bytes, cudaMemcpyDeviceToHost);
    const auto expected = probe_expected_sum(c.dtype, launch.world_size, count, case_seed);
    results.write(got.data(), static_cast<std::streamsize>(got.size()));
    ++cases;
    if (std::memcmp(got.data(), expected.data(), c.bytes) != 0) {
      size_t first = 0;
      while (got[first] == expected[first]) ++first;
      std::printf("MISMATCH %s %s %zu bytes %s: first differing byte %zu\n", dtype_name(c.dtype),
                  algo_name(c.algorithm), c.bytes, how, first);
      ++failures;
    }
  };

  for (bool graph : {false, true})
    for (DType dtype : {DType::kF32, DType::kBF16})
      for (auto algorithm : {IpcAllReduce::Algorithm::kOneShot, IpcAllReduce::Algorithm::kTwoShot})
        for (size_t bytes : {size_t{16}, size_t{4112}, size_t{8192}, size_t{98352}, size_t{1} << 20, ar->capacity()}) {
          const Case c{dtype, algorithm, bytes, graph};
          const int64_t count = static_cast<int64_t>(bytes / dtype_size(dtype));
          if (!graph) {
            const uint32_t s = seed++;
            const auto input = probe_input(dtype, launch.rank, count, s);
            HELPER_CHECK_CUDA(cudaMemcpyAsync(buffer, input.data(), bytes, cudaMemcpyHostToDevice, stream));
            if (Status st = ar->all_reduce(buffer, count, dtype, stream, algorithm); !st.ok())
              return std::printf("all_reduce: %s\n", st.to_string().c_str()), 2;
            HELPER_CHECK_CUDA(cudaStreamSynchronize(stream));
            check(c, count, s, "eager");
            continue;
          }
          // Captured once, replayed with new inputs: the epochs advance in device memory.
          cudaGraph_t g;
          cudaGraphExec_t exec;
          HELPER_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          const Status st = ar->all_reduce(buffer, count, dtype, stream, algorithm);
          HELPER_CHECK_CUDA(cudaStreamEndCapture(stream, &g));
          if (!st.ok()) return std::printf("all_reduce in capture: %s\n", st.to_string().c_str()), 2;
          HELPER_CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
          for (int replay = 0; replay < 3; ++replay) {
            const uint32_t s = seed++;
            const auto input = probe_input(dtype, launch.rank, count, s);
            HELPER_CHECK_CUDA(cudaMemcpyAsync(buffer, input.data(), bytes, cudaMemcpyHostToDevice, stream));
            HELPER_CHECK_CUDA(cudaGraphLaunch(exec, stream));
            HELPER_CHECK_CUDA(cudaStreamSynchronize(stream));
            check(c, count, s, "graph replay");
          }
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(g);
        }

  // Back to back without a host sync: each call's copy-in waits for the peers' previous reads (the end barrier).
  for (auto algorithm : {IpcAllReduce::Algorithm::kOneShot, IpcAllReduce::Algorithm::kTwoShot}) {
    const size_t bytes = 65536;
    const int64_t count = bytes / 4;
    constexpr int kCalls = 16;
    std::vector<uint32_t> seeds;
    for (int k = 0; k < kCalls; ++k) {
      seeds.push_back(seed++);
      const auto input = probe_input(DType::kF32, launch.rank, count, seeds.back());
      HELPER_CHECK_CUDA(cudaMemcpyAsync(buffer + k * bytes, input.data(), bytes, cudaMemcpyHostToDevice, stream));
    }
    for (int k = 0; k < kCalls; ++k)
      if (Status st = ar->all_reduce(buffer + k * bytes, count, DType::kF32, stream, algorithm); !st.ok())
        return std::printf("all_reduce: %s\n", st.to_string().c_str()), 2;
    HELPER_CHECK_CUDA(cudaStreamSynchronize(stream));
    for (int k = 0; k < kCalls; ++k) {
      std::vector<char> got(bytes);
      HELPER_CHECK_CUDA(cudaMemcpy(got.data(), buffer + k * bytes, bytes, cudaMemcpyDeviceToHost));
      results.write(got.data(), static_cast<std::streamsize>(bytes));
      ++cases;
      if (got != probe_expected_sum(DType::kF32, launch.world_size, count, seeds[k])) {
        std::printf("MISMATCH back-to-back %s call %d\n", algo_name(algorithm), k);
        ++failures;
      }
    }
  }

  cudaFree(buffer);
  cudaStreamDestroy(stream);
  cuda::release_custom_all_reduce(ar, *rank.boot);
  std::printf("ipc: %d cases, %d mismatches\n", cases, failures);
  return failures == 0 ? 0 : 1;
}

// Every rank makes the same random case; value (row, i) belongs to rank hash(row, i) % world, the others hold 0 —
// the MoE's exclusive rows under tensor parallelism.
struct MoeCase {
  int64_t n, top_k, hidden;
  bool shared;
};

std::vector<float> random_floats(size_t count, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(count);
  for (auto& x : v) x = d(gen);
  return v;
}

int run_moe(const fs::path& out_dir) {
  IpcRank rank;
  if (!open_ipc_rank(rank)) return 2;
  const LaunchEnv& launch = rank.launch;
  std::unique_ptr<IpcAllReduce>& ar = rank.ar;
  cudaStream_t stream;
  HELPER_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::ofstream results(out_dir / ("result" + std::to_string(launch.rank) + ".bin"), std::ios::binary);
  int failures = 0, cases = 0;
  // hidden 2048 / 7168: GLM-4.7-Flash's and DeepSeek-V3's rows in registers (8 and 32 values a thread); 96: a row
  // shorter than the block; 9000: longer than registers take (rmsnorm_row's loop). n 32: the most it takes.
  const std::vector<MoeCase> shapes = {{1, 4, 2048, true},  {3, 4, 7168, true}, {32, 4, 2048, true},
                                       {2, 6, 96, false},   {5, 2, 9000, true}, {1, 1, 2048, false}};
  uint32_t seed = 100;
  for (const MoeCase& m : shapes) {
    const int64_t rows = m.n * m.top_k + (m.shared ? m.n : 0), count = rows * m.hidden;
    std::vector<float> full = random_floats(static_cast<size_t>(count), seed++, 0.5f);
    std::vector<float> mine(full.size(), 0.f);
    for (int64_t at = 0; at < count; ++at)
      if (static_cast<int>((static_cast<uint64_t>(at) * 2654435761u >> 7) % launch.world_size) == launch.rank)
        mine[at] = full[at];
    const std::vector<float> resid0 = random_floats(static_cast<size_t>(m.n * m.hidden), seed++, 2.f);
    std::vector<uint16_t> weight(static_cast<size_t>(m.hidden));
    {
      const auto w = random_floats(weight.size(), seed++, 1.f);
      for (size_t i = 0; i < w.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &w[i], 4);
        weight[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
    const size_t y_bytes = static_cast<size_t>(count) * 4, r_bytes = resid0.size() * 4, o_bytes = resid0.size() * 2;
    float *y = nullptr, *y_sum = nullptr, *resid_ref = nullptr, *resid = nullptr;
    uint16_t *w = nullptr, *normed_ref = nullptr, *normed = nullptr;
    HELPER_CHECK_CUDA(cudaMalloc(&y, y_bytes));
    HELPER_CHECK_CUDA(cudaMalloc(&y_sum, y_bytes));
    HELPER_CHECK_CUDA(cudaMalloc(&resid_ref, r_bytes));
    HELPER_CHECK_CUDA(cudaMalloc(&resid, r_bytes));
    HELPER_CHECK_CUDA(cudaMalloc(&w, o_bytes / m.n));
    HELPER_CHECK_CUDA(cudaMalloc(&normed_ref, o_bytes));
    HELPER_CHECK_CUDA(cudaMalloc(&normed, o_bytes));
    HELPER_CHECK_CUDA(cudaMemcpyAsync(y, mine.data(), y_bytes, cudaMemcpyHostToDevice, stream));
    HELPER_CHECK_CUDA(cudaMemcpyAsync(w, weight.data(), weight.size() * 2, cudaMemcpyHostToDevice, stream));
    MoeCombineNorm run;
    run.y = y, run.n = m.n, run.top_k = m.top_k, run.hidden = m.hidden, run.shared = m.shared;
    run.residual = resid, run.norm_weight = w, run.eps = 1e-5f, run.normed = normed;
    if (!ar->takes(run)) return std::printf("the fused path refused n=%ld hidden=%ld\n", long(m.n), long(m.hidden)), 2;
    {
      MoeCombineNorm more = run;
      more.n = cuda::kMaxBlocks + 1;  // a prefill-sized step: left to the all-reduce and the caller's kernel
      if (ar->takes(more)) return std::printf("the fused path took %ld tokens\n", long(more.n)), 2;
      more = run;
      more.top_k = 8, more.hidden = 7168, more.shared = true;  // DeepSeek-V3's 258 KB a token: past shared memory
      if (ar->takes(more)) return std::printf("the fused path took 9 rows of 7168\n"), 2;
    }
    // The reference: the custom all-reduce's sum, then the core's kernel — the runner's unfused path.
    HELPER_CHECK_CUDA(cudaMemcpyAsync(resid_ref, resid0.data(), r_bytes, cudaMemcpyHostToDevice, stream));
    HELPER_CHECK_CUDA(cudaMemcpyAsync(y_sum, y, y_bytes, cudaMemcpyDeviceToDevice, stream));
    if (Status st = ar->all_reduce(y_sum, count, DType::kF32, stream); !st.ok())
      return std::printf("all_reduce: %s\n", st.to_string().c_str()), 2;
    if (Status st = ::kiln::cuda::moe_combine_add_rmsnorm_bf16(y_sum, m.n, m.top_k, m.hidden, nullptr,
                                                      m.shared ? y_sum + m.n * m.top_k * m.hidden : nullptr,
                                                      resid_ref, w, 1e-5f, normed_ref, stream);
        !st.ok())
      return std::printf("core combine: %s\n", st.to_string().c_str()), 2;
    HELPER_CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<char> want_r(r_bytes), want_o(o_bytes);
    HELPER_CHECK_CUDA(cudaMemcpy(want_r.data(), resid_ref, r_bytes, cudaMemcpyDeviceToHost));
    HELPER_CHECK_CUDA(cudaMemcpy(want_o.data(), normed_ref, o_bytes, cudaMemcpyDeviceToHost));
    auto compare = [&](const char* how) -> int {
      std::vector<char> got_r(r_bytes), got_o(o_bytes);
      HELPER_CHECK_CUDA(cudaMemcpy(got_r.data(), resid, r_bytes, cudaMemcpyDeviceToHost));
      HELPER_CHECK_CUDA(cudaMemcpy(got_o.data(), normed, o_bytes, cudaMemcpyDeviceToHost));
      results.write(got_r.data(), static_cast<std::streamsize>(r_bytes));
      results.write(got_o.data(), static_cast<std::streamsize>(o_bytes));
      ++cases;
      if (got_r != want_r || got_o != want_o) {
        std::printf("MISMATCH fused MoE sum n=%ld top_k=%ld hidden=%ld shared=%d %s: residual %s, normed %s\n",
                    long(m.n), long(m.top_k), long(m.hidden), int(m.shared), how, got_r == want_r ? "same" : "differs",
                    got_o == want_o ? "same" : "differs");
        ++failures;
      }
      return 0;
    };
    HELPER_CHECK_CUDA(cudaMemcpyAsync(resid, resid0.data(), r_bytes, cudaMemcpyHostToDevice, stream));
    if (Status st = ar->moe_combine_norm(run, stream); !st.ok())
      return std::printf("fused: %s\n", st.to_string().c_str()), 2;
    HELPER_CHECK_CUDA(cudaStreamSynchronize(stream));
    if (compare("eager") != 0) return 2;
    // Captured once and replayed: the residual is reset before each replay.
    cudaGraph_t g;
    cudaGraphExec_t exec;
    HELPER_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const Status st = ar->moe_combine_norm(run, stream);
    HELPER_CHECK_CUDA(cudaStreamEndCapture(stream, &g));
    if (!st.ok()) return std::printf("fused in capture: %s\n", st.to_string().c_str()), 2;
    HELPER_CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
    for (int replay = 0; replay < 2; ++replay) {
      HELPER_CHECK_CUDA(cudaMemcpyAsync(resid, resid0.data(), r_bytes, cudaMemcpyHostToDevice, stream));
      HELPER_CHECK_CUDA(cudaMemsetAsync(normed, 0, o_bytes, stream));
      HELPER_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      HELPER_CHECK_CUDA(cudaStreamSynchronize(stream));
      if (compare("graph replay") != 0) return 2;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    for (void* p : {static_cast<void*>(y), static_cast<void*>(y_sum), static_cast<void*>(resid_ref),
                    static_cast<void*>(resid), static_cast<void*>(w), static_cast<void*>(normed_ref),
                    static_cast<void*>(normed)})
      cudaFree(p);
  }
  cudaStreamDestroy(stream);
  cuda::release_custom_all_reduce(ar, *rank.boot);
  std::printf("moe: %d cases, %d mismatches\n", cases, failures);
  return failures == 0 ? 0 : 1;
}

int run_probe(const std::string& mode, const std::string& force) {
  LaunchEnv launch;
  auto boot = connect_from_env(launch);
  if (!boot.ok()) return std::printf("bootstrap: %s\n", boot.status().to_string().c_str()), 2;
  HELPER_CHECK_CUDA(cudaSetDevice(0));
  TransportSettings settings;
  settings.custom_all_reduce = mode == "on"    ? CustomAllReduceMode::kOn
                               : mode == "off" ? CustomAllReduceMode::kOff
                                               : CustomAllReduceMode::kAuto;
  settings.force_probe_failure = force == "all" || (force == "rank1" && launch.rank == 1);
  auto choice = cuda::choose_all_reduce(settings, **boot, 0);
  if (!choice.ok()) {
    std::printf("error: %s\n", choice.status().message().c_str());
    return 0;
  }
  if (choice->custom) {
    std::printf("choice: custom\n");
    cuda::release_custom_all_reduce(choice->custom, **boot);
  } else {
    std::printf("choice: nccl (%s)\n", choice->reason.c_str());
  }
  return 0;
}

int run_collective() {
  Registry& reg = global_registry();
  PluginLoader loader(reg);
  if (Status s = loader.load_file(KILN_NCCL_PLUGIN_FILE); !s.ok())
    return std::printf("plugin: %s\n", s.to_string().c_str()), 2;
  RecipeSection section("transport");
  section.set("custom_all_reduce", std::string("off"));
  CreateContext ctx;
  ctx.device = Device::cuda(0);
  ctx.section = &section;
  auto made = reg.create<Collective>("nccl", ctx);
  std::printf("create: %s\n", made.ok() ? "ok" : made.status().to_string().c_str());
  return 0;
}

}  // namespace
}  // namespace kiln::nccl

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc < 3) return std::fprintf(stderr, "usage: %s ipc|moe|probe MODE FORCE|collective OUT_DIR\n", argv[0]), 64;
  const std::string scenario = argv[1];
  const std::filesystem::path out_dir = argv[argc - 1];
  if (scenario == "ipc") return kiln::nccl::run_ipc(out_dir);
  if (scenario == "moe") return kiln::nccl::run_moe(out_dir);
  if (scenario == "probe" && argc == 5) return kiln::nccl::run_probe(argv[2], argv[3]);
  if (scenario == "collective") return kiln::nccl::run_collective();
  return std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str()), 64;
}
