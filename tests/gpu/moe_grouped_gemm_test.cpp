// The tensor-core grouped expert path (gate_up + SwiGLU, down, then moe_combine_bf16) against the CPU reference and
// the GEMV path, on routings that give multi-tile experts, experts with no tokens, one expert with every token,
// and shapes whose inter / hidden are not multiples of the tile sizes; both row-block sizes (64 rows while the mean
// pairs per expert is ≤ 64, else 128) are taken.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>

#include "device_buffer.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "moe_reference.h"

namespace kiln::test {
namespace {

struct GroupedCase {
  const char* name;
  int64_t experts, top_k, n, hidden, inter;
  std::vector<int32_t> allowed;  // experts the router may pick (empty: all)
  float limit;
};

// top_k distinct experts per token out of `allowed`, as the router gives.
std::vector<int32_t> random_routing(const GroupedCase& c, std::mt19937_64& rng) {
  std::vector<int32_t> pool = c.allowed;
  if (pool.empty()) {
    pool.resize(c.experts);
    std::iota(pool.begin(), pool.end(), 0);
  }
  std::vector<int32_t> ids(size_t(c.n) * c.top_k);
  for (int64_t t = 0; t < c.n; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    std::copy(pool.begin(), pool.begin() + c.top_k, ids.begin() + t * c.top_k);
  }
  return ids;
}

// Runs a test body with the grouped GEMMs in one form: the device default (the Hopper wgmma form on compute
// capability 9.0) or, with KILN_MOE_GROUPED_SM90=0, the mma.sync form.
class GroupedForm {
 public:
  explicit GroupedForm(bool mma_sync) : set_(mma_sync) {
    if (set_) setenv("KILN_MOE_GROUPED_SM90", "0", 1);
  }
  ~GroupedForm() {
    if (set_) unsetenv("KILN_MOE_GROUPED_SM90");
  }
  GroupedForm(const GroupedForm&) = delete;
  GroupedForm& operator=(const GroupedForm&) = delete;

 private:
  bool set_;
};

// Tolerance: norm-relative 1e-2 for h (bf16 output of fp32 accumulation) and for the bf16 token outputs, against the
// CPU (fp32 with h rounded to bf16 as the GPU stores it) and against the GEMV path; any NaN / unwritten element
// (buffers are poisoned with NaN) fails.
void expect_matches_cpu_and_gemv_path() {
  std::mt19937_64 rng(71);
  const std::vector<GroupedCase> cases = {
      {"two row blocks an expert, the second half full", 16, 4, 600, 512, 384, {}, INFINITY},
      {"k 2560 (40 k tiles), top-8 of 16", 16, 8, 70, 2560, 256, {}, INFINITY},
      {"glm47-flash shapes, 37 tokens", 64, 4, 37, 2048, 1536, {}, INFINITY},
      {"multi-tile experts, inter 200, clamped", 8, 2, 301, 512, 200, {}, 0.5f},
      {"k tails: hidden 264, inter 104", 16, 4, 9, 264, 104, {}, INFINITY},
      {"most experts empty", 32, 2, 50, 256, 128, {1, 5, 6, 30}, INFINITY},
      {"every token on one expert (64-row blocks)", 8, 1, 257, 128, 64, {3}, INFINITY},
      {"every token on one expert (128-row blocks)", 2, 1, 300, 256, 136, {1}, INFINITY},
      {"one token", 64, 4, 1, 2048, 1536, {}, INFINITY},
  };
  for (const GroupedCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t n = c.n, top_k = c.top_k, hidden = c.hidden, inter = c.inter, experts = c.experts;
    const int64_t pairs = n * top_k;
    const Bf16Data x = random_bf16(size_t(n) * hidden, rng);
    const Bf16Data gate_up = random_bf16(size_t(experts) * 2 * inter * hidden, rng, -0.1f, 0.1f);
    const Bf16Data down = random_bf16(size_t(experts) * hidden * inter, rng, -0.1f, 0.1f);
    const std::vector<int32_t> ids = random_routing(c, rng);
    const std::vector<float> route_w = random_f32(ids.size(), rng, 0.1f, 1.f);
    const Bf16Data shared = random_bf16(size_t(n) * hidden, rng);
    const MoeReference ref = moe_reference(x.values, n, top_k, hidden, inter, gate_up.values, down.values, ids,
                                           route_w, shared.values, c.limit);

    DeviceBuffer<uint16_t> dx(x.bits), dgu(gate_up.bits), ddown(down.bits), dshared(shared.bits);
    DeviceBuffer<uint16_t> dh(size_t(pairs) * inter), dout(size_t(n) * hidden), dout_gemv(size_t(n) * hidden);
    DeviceBuffer<int32_t> dids(ids), offsets(experts + 1), active(experts), order(pairs);
    DeviceBuffer<float> drw(route_w), dy(size_t(pairs) * hidden);
    for (auto* b : {&dh, &dout, &dout_gemv}) b->poison();
    dy.poison();
    const cuda::MoeDispatch d{offsets.get(), active.get(), order.get()};
    KILN_STATUS_OK(cuda::moe_group_by_expert(dids.get(), pairs, experts, d, nullptr));
    KILN_STATUS_OK(cuda::moe_gate_up_swiglu_grouped_bf16(dx.get(), n, top_k, hidden, inter, dgu.get(), experts, d,
                                                         c.limit, dh.get(), nullptr));
    KILN_STATUS_OK(cuda::moe_down_grouped_bf16(dh.get(), pairs, inter, hidden, ddown.get(), experts, d, drw.get(),
                                               dy.get(), nullptr));
    KILN_STATUS_OK(cuda::moe_combine_bf16(dy.get(), n, top_k, hidden, dshared.get(), dout.get(), nullptr));
    KILN_CUDA_OK(cudaDeviceSynchronize());

    // h is in grouped order: row s belongs to pair pair_order[s].
    const std::vector<int32_t> pair_order = order.download();
    const std::vector<float> h_grouped = widen(dh.download());
    std::vector<float> h(h_grouped.size());
    for (int64_t s = 0; s < pairs; ++s) {
      ASSERT_GE(pair_order[s], 0);
      ASSERT_LT(pair_order[s], pairs);
      std::copy_n(h_grouped.begin() + s * inter, inter, h.begin() + int64_t(pair_order[s]) * inter);
    }
    EXPECT_LT(rel_error(h, ref.h), 1e-2);
    const std::vector<float> out = widen(dout.download());
    EXPECT_LT(rel_error(out, ref.out), 1e-2);

    // The GEMV path on the same dispatch (it overwrites dh / dy, already read back).
    KILN_STATUS_OK(cuda::moe_gate_up_swiglu_bf16(dx.get(), n, top_k, hidden, inter, dgu.get(), experts, d, c.limit,
                                                 dh.get(), nullptr));
    KILN_STATUS_OK(cuda::moe_down_bf16(dh.get(), pairs, inter, hidden, ddown.get(), experts, d, drw.get(), dy.get(),
                                       nullptr));
    KILN_STATUS_OK(cuda::moe_combine_bf16(dy.get(), n, top_k, hidden, dshared.get(), dout_gemv.get(), nullptr));
    EXPECT_LT(rel_error(out, widen(dout_gemv.download())), 1e-2);
  }
}

TEST(GpuMoeGroupedGemm, MatchesCpuAndGemvPath) { expect_matches_cpu_and_gemv_path(); }

TEST(GpuMoeGroupedGemm, MmaSyncFormMatchesCpuAndGemvPath) {
  const GroupedForm form(true);
  expect_matches_cpu_and_gemv_path();
}

// A token's output does not depend on the other tokens of the step: the first 150 of 700 tokens alone give the
// bits they give inside the whole batch (same routing), though their rows sit at other places of other row blocks.
TEST(GpuMoeGroupedGemm, TokensGiveTheSameBitsAloneAndInABatch) {
  for (const bool mma_sync : {false, true}) {
    SCOPED_TRACE(mma_sync ? "mma.sync form" : "default form");
    const GroupedForm form(mma_sync);
    std::mt19937_64 rng(73);
    const int64_t experts = 8, top_k = 2, n = 700, part = 150, hidden = 320, inter = 192;
    const GroupedCase c{"batch", experts, top_k, n, hidden, inter, {}, INFINITY};
    const Bf16Data x = random_bf16(size_t(n) * hidden, rng);
    const Bf16Data gate_up = random_bf16(size_t(experts) * 2 * inter * hidden, rng, -0.1f, 0.1f);
    const Bf16Data down = random_bf16(size_t(experts) * hidden * inter, rng, -0.1f, 0.1f);
    const std::vector<int32_t> ids = random_routing(c, rng);
    const std::vector<float> route_w = random_f32(ids.size(), rng, 0.1f, 1.f);
    DeviceBuffer<uint16_t> dx(x.bits), dgu(gate_up.bits), ddown(down.bits);
    DeviceBuffer<int32_t> dids(ids);
    DeviceBuffer<float> drw(route_w);
    auto run = [&](int64_t tokens, std::vector<uint16_t>& result) {  // void: the KILN_*_OK asserts return
      const int64_t pairs = tokens * top_k;
      DeviceBuffer<uint16_t> dh(size_t(pairs) * inter), dout(size_t(tokens) * hidden);
      DeviceBuffer<int32_t> offsets(experts + 1), active(experts), order(pairs);
      DeviceBuffer<float> dy(size_t(pairs) * hidden);
      const cuda::MoeDispatch d{offsets.get(), active.get(), order.get()};
      KILN_STATUS_OK(cuda::moe_group_by_expert(dids.get(), pairs, experts, d, nullptr));
      KILN_STATUS_OK(cuda::moe_gate_up_swiglu_grouped_bf16(dx.get(), tokens, top_k, hidden, inter, dgu.get(), experts,
                                                           d, INFINITY, dh.get(), nullptr));
      KILN_STATUS_OK(cuda::moe_down_grouped_bf16(dh.get(), pairs, inter, hidden, ddown.get(), experts, d, drw.get(),
                                                 dy.get(), nullptr));
      KILN_STATUS_OK(cuda::moe_combine_bf16(dy.get(), tokens, top_k, hidden, nullptr, dout.get(), nullptr));
      KILN_CUDA_OK(cudaDeviceSynchronize());
      result = dout.download();
    };
    std::vector<uint16_t> whole, alone;
    run(n, whole);
    run(part, alone);
    ASSERT_EQ(alone.size(), size_t(part) * hidden);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), whole.begin()));
  }
}

// No host sync inside: the grouping and both grouped GEMMs capture into a CUDA graph (global capture mode) and the
// replay on new routing equals an eager run bit for bit (the path is deterministic).
TEST(GpuMoeGroupedGemm, CapturesIntoACudaGraph) {
  std::mt19937_64 rng(72);
  const int64_t experts = 16, top_k = 4, n = 200, hidden = 256, inter = 128, pairs = n * top_k;
  const GroupedCase c{"graph", experts, top_k, n, hidden, inter, {}, INFINITY};
  const Bf16Data x = random_bf16(size_t(n) * hidden, rng);
  const Bf16Data gate_up = random_bf16(size_t(experts) * 2 * inter * hidden, rng, -0.1f, 0.1f);
  const Bf16Data down = random_bf16(size_t(experts) * hidden * inter, rng, -0.1f, 0.1f);
  const std::vector<float> route_w = random_f32(pairs, rng, 0.1f, 1.f);
  DeviceBuffer<uint16_t> dx(x.bits), dgu(gate_up.bits), ddown(down.bits), dh(size_t(pairs) * inter);
  DeviceBuffer<uint16_t> dout(size_t(n) * hidden);
  DeviceBuffer<int32_t> dids(random_routing(c, rng)), offsets(experts + 1), active(experts), order(pairs);
  DeviceBuffer<float> drw(route_w), dy(size_t(pairs) * hidden);
  const cuda::MoeDispatch d{offsets.get(), active.get(), order.get()};
  cudaStream_t stream = nullptr;
  KILN_CUDA_OK(cudaStreamCreate(&stream));
  auto run = [&]() -> Status {
    KILN_RETURN_IF_ERROR(cuda::moe_group_by_expert(dids.get(), pairs, experts, d, stream));
    KILN_RETURN_IF_ERROR(cuda::moe_gate_up_swiglu_grouped_bf16(dx.get(), n, top_k, hidden, inter, dgu.get(), experts,
                                                               d, INFINITY, dh.get(), stream));
    KILN_RETURN_IF_ERROR(cuda::moe_down_grouped_bf16(dh.get(), pairs, inter, hidden, ddown.get(), experts, d,
                                                     drw.get(), dy.get(), stream));
    return cuda::moe_combine_bf16(dy.get(), n, top_k, hidden, nullptr, dout.get(), stream);
  };
  cudaGraph_t graph = nullptr;
  KILN_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status captured = run();
  KILN_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  KILN_STATUS_OK(captured);
  cudaGraphExec_t exec = nullptr;
  KILN_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  dids.upload(random_routing(c, rng));  // the graph reads the routing on the device at replay
  dout.poison();
  KILN_CUDA_OK(cudaGraphLaunch(exec, stream));
  KILN_CUDA_OK(cudaStreamSynchronize(stream));
  const std::vector<uint16_t> replayed = dout.download();
  dout.poison();
  KILN_STATUS_OK(run());
  KILN_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(replayed, dout.download());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(GpuMoeGroupedGemm, RejectsUnsupportedShapes) {
  const cuda::MoeDispatch d{};
  EXPECT_FALSE(cuda::moe_gate_up_swiglu_grouped_bf16(nullptr, 4, 2, 100, 64, nullptr, 8, d, INFINITY, nullptr, nullptr)
                   .ok());  // hidden % 8 != 0
  EXPECT_FALSE(cuda::moe_down_grouped_bf16(nullptr, 4, 60, 128, nullptr, 8, d, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(cuda::moe_gate_up_swiglu_grouped_bf16(nullptr, 4, 2, 128, 64, nullptr, 2000, d, INFINITY, nullptr,
                                                     nullptr)
                   .ok());  // num_experts > 1024
}

}  // namespace
}  // namespace kiln::test
