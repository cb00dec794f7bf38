// The `nccl` collective from the built plugin with a one-rank communicator (label `gpu`): all four collectives
// against expected values, eagerly and inside a captured CUDA graph, through NCCL (custom_all_reduce = off) and
// through the custom kernel (on: its probe passes with one rank too); and the watchdog aborting a hung call.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "kiln/collective.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "probe_pattern.h"

namespace kiln::nccl {
namespace {

Registry& registry() {
  static const Status loaded = [] {
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
    PluginLoader loader(global_registry());
    return loader.load_file(KILN_NCCL_PLUGIN_FILE);
  }();
  EXPECT_TRUE(loaded.ok()) << loaded.to_string();
  return global_registry();
}

std::shared_ptr<Collective> make(const std::string& mode) {
  RecipeSection section("transport");
  section.set("custom_all_reduce", mode);
  section.set("env", StringTable{{"NCCL_DEBUG", "WARN"}});
  CreateContext ctx;
  ctx.device = Device::cuda(0);
  ctx.section = &section;
  auto made = registry().create<Collective>("nccl", ctx);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? *made : nullptr;
}

struct DeviceBuffer {
  char* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  void put(const std::vector<char>& v) {
    ASSERT_EQ(cudaMemcpy(p, v.data(), v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<char> get() const {
    std::vector<char> v(bytes);
    EXPECT_EQ(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// Runs the four collectives on `stream` (so a caller can capture them): with one rank, all_reduce and broadcast
// keep the data, all_gather and reduce_scatter copy it.
void enqueue_all(Collective& c, Stream stream, DeviceBuffer& reduce_f32, DeviceBuffer& reduce_bf16,
                 DeviceBuffer& gather_in, DeviceBuffer& gather_out, DeviceBuffer& scatter_out, DeviceBuffer& bcast) {
  ASSERT_TRUE(c.all_reduce(reduce_f32.p, reduce_f32.bytes / 4, DType::kF32, ReduceOp::kSum, stream).ok());
  ASSERT_TRUE(c.all_reduce(reduce_bf16.p, reduce_bf16.bytes / 2, DType::kBF16, ReduceOp::kSum, stream).ok());
  ASSERT_TRUE(c.all_reduce(reduce_bf16.p, reduce_bf16.bytes / 2, DType::kBF16, ReduceOp::kMax, stream).ok());
  ASSERT_TRUE(c.all_gather(gather_in.p, gather_out.p, gather_in.bytes / 2, DType::kI16, stream).ok());
  ASSERT_TRUE(
      c.reduce_scatter(gather_in.p, scatter_out.p, gather_in.bytes / 2, DType::kBF16, ReduceOp::kSum, stream).ok());
  ASSERT_TRUE(c.broadcast(bcast.p, bcast.bytes / 4, DType::kI32, 0, stream).ok());
}

void run_collectives(const std::string& mode, bool graph) {
  auto c = make(mode);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world_size(), 1);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const Stream stream{Device::cuda(0), s};
  const int64_t n = 12288;  // 48 KiB of fp32: takes the custom path when it is on
  DeviceBuffer rf(n * 4), rb(n * 2), gin(n * 2), gout(n * 2), sout(n * 2), bc(n * 4);
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    enqueue_all(*c, stream, rf, rb, gin, gout, sout, bc);
    ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    cudaGraphDestroy(g);
  }
  for (uint32_t seed = 1; seed <= (graph ? 3u : 1u); ++seed) {
    const auto f32 = probe_input(DType::kF32, 0, n, seed), bf16 = probe_input(DType::kBF16, 0, n, seed);
    const auto words = probe_input(DType::kBF16, 0, n, seed + 100);
    const auto ints = probe_input(DType::kF32, 0, n, seed + 200);  // any 4-byte words
    rf.put(f32);
    rb.put(bf16);
    gin.put(words);
    bc.put(ints);
    ASSERT_EQ(cudaMemset(gout.p, 0, gout.bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(sout.p, 0, sout.bytes), cudaSuccess);
    // put() and cudaMemset run on the legacy default stream, which a non-blocking stream does not wait for (and
    // cudaMemset returns before it has run): without this the collectives could read or write around them — seen
    // on an H100 shared with other processes, where all_gather's output was then overwritten by the zeros.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (graph)
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    else
      enqueue_all(*c, stream, rf, rb, gin, gout, sout, bc);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_TRUE(rf.get() == f32) << "all_reduce fp32, seed " << seed;
    EXPECT_TRUE(rb.get() == bf16) << "all_reduce bf16 (sum, then max), seed " << seed;
    EXPECT_TRUE(gout.get() == words) << "all_gather, seed " << seed;
    EXPECT_TRUE(sout.get() == words) << "reduce_scatter, seed " << seed;
    EXPECT_TRUE(bc.get() == ints) << "broadcast, seed " << seed;
  }
  if (exec) cudaGraphExecDestroy(exec);
  cudaStreamDestroy(s);
}

TEST(NcclOneRank, CollectivesThroughNccl) {
  run_collectives("off", false);
}
TEST(NcclOneRank, CollectivesThroughNcclInACapturedGraph) {
  run_collectives("off", true);
}
TEST(NcclOneRank, CollectivesWithTheCustomAllReduce) {
  run_collectives("on", false);
}
TEST(NcclOneRank, CollectivesWithTheCustomAllReduceInACapturedGraph) {
  run_collectives("on", true);
}

TEST(NcclOneRank, RefusesAStreamOfAnotherDeviceAndABadRoot) {
  auto c = make("off");
  ASSERT_NE(c, nullptr);
  DeviceBuffer b(64);
  Status cpu = c->all_reduce(b.p, 16, DType::kF32, ReduceOp::kSum, Stream{Device::cpu(), nullptr});
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.message().find("this rank's communicator is on cuda:0"), std::string::npos) << cpu.message();
  Status root = c->broadcast(b.p, 16, DType::kF32, 1, Stream{Device::cuda(0), nullptr});
  ASSERT_FALSE(root.ok());
  EXPECT_NE(root.message().find("root 1 of world size 1"), std::string::npos) << root.message();
  Status i16 = c->all_reduce(b.p, 16, DType::kI16, ReduceOp::kSum, Stream{Device::cuda(0), nullptr});
  ASSERT_FALSE(i16.ok());
  EXPECT_NE(i16.message().find("cannot reduce"), std::string::npos) << i16.message();
}

// The watchdog (comm_watchdog.h) on a real communicator: with transport.timeout_s = 1, an all_reduce stuck behind a
// host function that holds the stream for 3 s is aborted (ncclCommAbort) once past the bound, the next call
// returns the reason instead of enqueuing, the stream drains, and a new communicator in the same process works.
TEST(NcclOneRank, AHungCallIsAbortedAndTheNextCommunicatorWorks) {
  {
    RecipeSection section("transport");
    section.set("custom_all_reduce", std::string("off"));
    section.set("timeout_s", int64_t{1});
    section.set("env", StringTable{{"NCCL_DEBUG", "WARN"}});
    CreateContext ctx;
    ctx.device = Device::cuda(0);
    ctx.section = &section;
    auto made = registry().create<Collective>("nccl", ctx);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    std::shared_ptr<Collective> c = *made;
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const Stream stream{Device::cuda(0), s};
    DeviceBuffer b(4096);
    ASSERT_EQ(cudaMemset(b.p, 0, b.bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the memset is on the legacy stream, which `s` does not wait for
    // A healthy call completes and is retired: no abort.
    ASSERT_TRUE(c->all_reduce(b.p, 1024, DType::kF32, ReduceOp::kSum, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ASSERT_TRUE(c->all_reduce(b.p, 1024, DType::kF32, ReduceOp::kSum, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    // The injected hang: the stream held for 3 s, the collective queued behind it.
    ASSERT_EQ(cudaLaunchHostFunc(
                  s, [](void*) { std::this_thread::sleep_for(std::chrono::seconds(3)); }, nullptr),
              cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(c->all_reduce(b.p, 1024, DType::kF32, ReduceOp::kSum, stream).ok());  // enqueued
    std::this_thread::sleep_for(std::chrono::milliseconds(2200));
    const Status after = c->all_reduce(b.p, 1024, DType::kF32, ReduceOp::kSum, stream);
    ASSERT_FALSE(after.ok());
    // Not bounded by the 3 s hold: on the H200 (NCCL 2.28.3) the failed call returned at 3.006 s, after the host
    // function let the stream go — ncclCommAbort of a communicator whose call is still queued waits for it. So the
    // watchdog turns a hang into an error only once the stream moves (a rank that never returns is ended by the
    // launcher); the elapsed time is printed, not asserted.
    std::printf("the failed call returned %.3f s after the hold began\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    EXPECT_NE(after.message().find("ncclAllReduce of 1024 F32 did not complete within transport.timeout_s = 1 s"),
              std::string::npos)
        << after.message();
    EXPECT_NE(after.message().find("ncclCommAbort"), std::string::npos) << after.message();
    (void)cudaStreamSynchronize(s);  // the host function ends; what the aborted call left is not looked at
    (void)cudaGetLastError();
    c.reset();
    cudaStreamDestroy(s);
  }
  run_collectives("off", false);
}

TEST(NcclOneRank, RecipeEnvWithAForeignNameIsRefusedBeforeNccl) {
  RecipeSection section("transport");
  section.set("env", StringTable{{"LD_PRELOAD", "x.so"}});
  CreateContext ctx;
  ctx.device = Device::cuda(0);
  ctx.section = &section;
  auto made = registry().create<Collective>("nccl", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("`LD_PRELOAD` is not an NCCL setting"), std::string::npos)
      << made.status().message();
}

}  // namespace
}  // namespace kiln::nccl
