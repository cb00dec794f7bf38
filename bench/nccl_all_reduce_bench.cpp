// All-reduce latency between two processes, 8 KB .. 8 MB of bf16, each call inside a captured CUDA graph: the
// custom CUDA-IPC kernels of transport-nccl (one-shot and two-shot) and NCCL's all-reduce where NCCL can run (it
// refuses two ranks on one GPU, so on a one-GPU machine its column says so; with two GPUs each rank takes its own).
// Every size is first checked against the host's rank-order sum. Then the MoE block's fused sum + combine + RMSNorm
// against the sum followed by the core's kernel, at decode-sized steps. Ranks share one GPU without MPS by time-slicing,
// which the figures then include; run under MPS (nvidia-cuda-mps-control -d) to see the kernels themselves.
// Usage: kiln_bench_nccl_all_reduce_bench [--ranks N] [--graph-calls K] [--launches L]
//   It starts N copies of itself (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; rank r on GPU r % GPUs) and
//   prints rank 0's table. Run with those variables already set (torchrun style), it is one rank.
#include <cuda_runtime.h>
#include <nccl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_check.h"
#include "ipc_all_reduce.h"
#include "kernels/cuda/moe_experts.h"
#include "kiln/launch_env.h"
#include "probe_pattern.h"
#include "kiln/tcp_bootstrap.h"

namespace {
using kiln::DType;
using kiln::nccl::cuda::IpcAllReduce;

#define CHECK_NCCL(x)                                                                  \
  do {                                                                                 \
    ncclResult_t r_ = (x);                                                             \
    if (r_ != ncclSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, ncclGetErrorString(r_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct Options {
  int ranks = 2, graph_calls = 20, launches = 20;
};

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Launcher: N copies of this program, one per rank; rank 0 prints, the others' output goes to /dev/null.
int launch(const Options& o, char** argv) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(o.ranks).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (r != 0 && !std::freopen("/dev/null", "w", stdout)) _exit(126);
      ::execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(pid);
  }
  int worst = 0;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) worst = 1;
  }
  return worst;
}

// Microseconds per call: L launches of a graph of K calls, after one warm-up launch; every rank starts together.
template <class Enqueue>
double time_graph(kiln::TcpBootstrap& boot, cudaStream_t s, const Options& o, Enqueue enqueue) {
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < o.graph_calls; ++k) enqueue();
  CHECK_CUDA(cudaStreamEndCapture(s, &g));
  CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_OK(boot.barrier());
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, s));
  for (int l = 0; l < o.launches; ++l) CHECK_CUDA(cudaGraphLaunch(exec, s));
  CHECK_CUDA(cudaEventRecord(stop, s));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  return 1000.0 * ms / (o.launches * o.graph_calls);
}

// NCCL's column: µs, or why there is none (NCCL refuses two ranks on one GPU).
std::string nccl_cell(double us) {
  if (us < 0) return "n/a (1 GPU)";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", us);
  return text;
}

int run_rank(const Options& o) {
  auto launch_env = kiln::read_launch_env(kiln::process_env());
  CHECK_OK(launch_env.status());
  const auto& env = *launch_env;
  int gpus = 0;
  CHECK_CUDA(cudaGetDeviceCount(&gpus));
  const int device = env.local_rank % gpus;
  CHECK_CUDA(cudaSetDevice(device));
  auto boot_made = kiln::TcpBootstrap::connect(kiln::rendezvous_spec(env));
  CHECK_OK(boot_made.status());
  auto& boot = **boot_made;

  auto made = IpcAllReduce::create(env.rank, env.world_size);
  CHECK_OK(made.status());
  std::unique_ptr<IpcAllReduce> ar = std::move(*made);
  auto handle = ar->export_handle();
  CHECK_OK(handle.status());
  auto handles = boot.all_gather(*handle);
  CHECK_OK(handles.status());
  CHECK_OK(ar->open_peers(*handles));

  // NCCL only where every rank has a GPU of its own.
  char bus[32] = {0};
  CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
  auto buses = boot.all_gather(bus);
  CHECK_OK(buses.status());
  std::vector<std::string> sorted = *buses;
  std::sort(sorted.begin(), sorted.end());
  const bool nccl_possible = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  ncclComm_t comm = nullptr;
  if (nccl_possible) {
    ncclUniqueId id;
    std::string bytes;
    if (env.rank == 0) {
      CHECK_NCCL(ncclGetUniqueId(&id));
      bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
    }
    auto got = boot.broadcast(bytes);
    CHECK_OK(got.status());
    std::memcpy(&id, got->data(), sizeof id);
    CHECK_NCCL(ncclCommInitRank(&comm, env.world_size, id, env.rank));
  }

  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char* buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, ar->capacity()));
  if (env.rank == 0) {
    std::printf("all-reduce, bf16, %d processes on %s, %d calls per CUDA graph x %d launches; µs per call\n",
                env.world_size, nccl_possible ? "one GPU each" : "one shared GPU (time-sliced unless MPS runs)",
                o.graph_calls, o.launches);
    std::printf("%10s %12s %12s %12s %10s\n", "bytes", "one-shot", "two-shot", "NCCL", "check");
  }
  for (size_t bytes = 8 << 10; bytes <= ar->capacity(); bytes *= 2) {
    const int64_t count = static_cast<int64_t>(bytes / 2);
    // Correctness first: one eager call on the probe's data.
    const auto input = kiln::nccl::probe_input(DType::kBF16, env.rank, count, static_cast<uint32_t>(bytes));
    // On `s`: a non-blocking stream waits for no legacy-stream copy, and a pageable cudaMemcpy may return early.
    CHECK_CUDA(cudaMemcpyAsync(buf, input.data(), bytes, cudaMemcpyHostToDevice, s));
    CHECK_OK(ar->all_reduce(buf, count, DType::kBF16, s));
    std::vector<char> got(bytes);
    CHECK_CUDA(cudaMemcpyAsync(got.data(), buf, bytes, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    const bool ok =
        got == kiln::nccl::probe_expected_sum(DType::kBF16, env.world_size, count, static_cast<uint32_t>(bytes));
    // Timing on zeros, which repeated sums keep finite.
    CHECK_CUDA(cudaMemsetAsync(buf, 0, bytes, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    const double one = time_graph(
        boot, s, o, [&] { CHECK_OK(ar->all_reduce(buf, count, DType::kBF16, s, IpcAllReduce::Algorithm::kOneShot)); });
    const double two = time_graph(
        boot, s, o, [&] { CHECK_OK(ar->all_reduce(buf, count, DType::kBF16, s, IpcAllReduce::Algorithm::kTwoShot)); });
    double nccl = -1;
    if (comm)
      nccl = time_graph(boot, s, o, [&] {
        CHECK_NCCL(ncclAllReduce(buf, buf, static_cast<size_t>(count), ncclBfloat16, ncclSum, comm, s));
      });
    if (env.rank == 0) {
      std::printf("%10zu %12.2f %12.2f %12s %10s\n", bytes, one, two, nccl_cell(nccl).c_str(), ok ? "ok" : "WRONG");
    }
    if (!ok) std::fprintf(stderr, "rank %d: wrong all-reduce result at %zu bytes\n", env.rank, bytes);
  }
  // The MoE block's sum under tensor parallelism at GLM-4.7-Flash's shape (top-4 + the shared expert, hidden 2048,
  // fp32 pair rows) for decode-sized steps: the sum then the core's combine + residual add + RMSNorm kernel (two
  // launches, the runner's path without the fusion) against the fused launch. Both on zeros (finite when repeated);
  // the bits are checked by TwoProcessesOneGpu.FusedMoeSumAndNormGiveTheUnfusedBits.
  {
    constexpr int64_t kTopK = 4, kHidden = 2048;
    float* resid = nullptr;
    uint16_t *weight = nullptr, *normed = nullptr;
    constexpr int64_t kMaxTokens = 32;  // the most the fused path takes
    CHECK_CUDA(cudaMalloc(&resid, kMaxTokens * kHidden * 4));
    CHECK_CUDA(cudaMalloc(&weight, kHidden * 2));
    CHECK_CUDA(cudaMalloc(&normed, kMaxTokens * kHidden * 2));
    CHECK_CUDA(cudaMemsetAsync(resid, 0, kMaxTokens * kHidden * 4, s));
    CHECK_CUDA(cudaMemsetAsync(weight, 0, kHidden * 2, s));
    CHECK_CUDA(cudaMemsetAsync(buf, 0, ar->capacity(), s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    if (env.rank == 0) {
      std::printf("\nMoE sum + combine + residual add + RMSNorm (top-%ld + shared, hidden %ld, fp32 rows); µs per call\n",
                  long(kTopK), long(kHidden));
      std::printf("%10s %10s %16s %16s %12s %16s\n", "tokens", "KB", "custom + kernel", "fused (custom)", "saved",
                  "NCCL + kernel");
    }
    for (int64_t n : {int64_t{1}, int64_t{4}, int64_t{16}, kMaxTokens}) {
      const int64_t count = n * (kTopK + 1) * kHidden;
      float* y = reinterpret_cast<float*>(buf);
      auto core_kernel = [&] {
        CHECK_OK(kiln::cuda::moe_combine_add_rmsnorm_bf16(y, n, kTopK, kHidden, nullptr, y + n * kTopK * kHidden, resid,
                                                          weight, 1e-5f, normed, s));
      };
      const double unfused = time_graph(boot, s, o, [&] {
        CHECK_OK(ar->all_reduce(y, count, DType::kF32, s));
        core_kernel();
      });
      kiln::MoeCombineNorm run;
      run.y = y, run.n = n, run.top_k = kTopK, run.hidden = kHidden, run.shared = true;
      run.residual = resid, run.norm_weight = weight, run.eps = 1e-5f, run.normed = normed;
      const double fused = time_graph(boot, s, o, [&] { CHECK_OK(ar->moe_combine_norm(run, s)); });
      double nccl = -1;
      if (comm)
        nccl = time_graph(boot, s, o, [&] {
          CHECK_NCCL(ncclAllReduce(y, y, static_cast<size_t>(count), ncclFloat32, ncclSum, comm, s));
          core_kernel();
        });
      if (env.rank == 0) {
        std::printf("%10ld %10.1f %16.2f %16.2f %11.0f%% %16s\n", long(n), count * 4 / 1024.0, unfused, fused,
                    100.0 * (1.0 - fused / unfused), nccl_cell(nccl).c_str());
      }
    }
    CHECK_CUDA(cudaFree(resid));
    CHECK_CUDA(cudaFree(weight));
    CHECK_CUDA(cudaFree(normed));
  }
  CHECK_CUDA(cudaFree(buf));
  if (comm) ncclCommDestroy(comm);
  ar->close_peers();
  CHECK_OK(boot.barrier());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--ranks")
      o.ranks = v;
    else if (flag == "--graph-calls")
      o.graph_calls = v;
    else if (flag == "--launches")
      o.launches = v;
    else
      return std::fprintf(stderr, "unknown option %s\n", argv[i]), 64;
  }
  if (o.ranks < 1 || o.ranks > 8 || o.graph_calls < 1 || o.launches < 1)
    return std::fprintf(stderr, "--ranks 1..8, --graph-calls and --launches >= 1\n"), 64;
  if (!std::getenv("RANK")) return launch(o, argv);
  return run_rank(o);
}
