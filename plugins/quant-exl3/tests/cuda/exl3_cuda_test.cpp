// The `exl3` format's CUDA half against its CPU reference, on random EXL3 modules (any trellis payload is a valid
// encoding): the decoded Ŵ and the dequantized W bit for bit for every K × codebook; the product within tolerance;
// batch invariance and CUDA-graph replay bit for bit; the routed experts; a mixed EXL3 + dense stack; dummy weights.
// Tolerances are ‖Δ‖ / ‖ref‖ over a case's outputs, with the CPU fed the same bf16-rounded inputs: 1e-5 for fp32
// outputs (the GPU multiplies on the tensor cores with the rotated input split into fp16 hi + lo parts, exact to
// about 2^-22, and fp32 accumulators; the summation order differs: per tile, per split, across splits), 1e-2 for bf16 outputs (one bf16 rounding, 2^-9 relative), 1e-4 for the experts (fp32 plus expf vs
// std::exp in SiLU). Every test skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <string>
#include <vector>

#include "exl3_cpu_linear.h"
#include "exl3_cuda_format.h"
#include "exl3_kernels.h"
#include "exl3_module.h"
#include "exl3_test_source.h"
#include "gpu/device_buffer.h"
#include "runtime/cuda/cuda_device_context.h"

namespace kiln::exl3 {
namespace {

using kiln::test::DeviceBuffer;
using kiln::test::rel_error;

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

class Exl3Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    auto dev = kiln::cuda::CudaDeviceContext::create();
    ASSERT_TRUE(dev.ok()) << dev.status().to_string();
    dev_ = std::move(*dev);
    format_ = cuda::make_cuda_weight_format(*dev_, nullptr, cuda::SyntheticModules{});
  }
  Stream stream() const { return dev_->stream(); }

  std::unique_ptr<Linear> gpu_linear(const WeightSource& s, const std::vector<std::string>& names,
                                     const std::vector<int64_t>& outs, int64_t in) {
    LinearSpec spec{names, outs, in};
    auto l = format_->load_linear(s, spec);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    return l.ok() ? std::move(*l) : nullptr;
  }
  std::unique_ptr<Linear> cpu_linear(const WeightSource& s, const std::vector<std::string>& names,
                                     const std::vector<int64_t>& outs, int64_t in) {
    std::vector<Part> parts;
    for (size_t i = 0; i < names.size(); ++i) {
      auto p = read_part(s, names[i], in, outs[i]);
      EXPECT_TRUE(p.ok()) << p.status().to_string();
      parts.push_back(std::move(*p));
    }
    auto l = make_cpu_linear(std::move(parts), in);
    return l.ok() ? std::move(l).value() : nullptr;
  }

  // y (fp32 or bf16 widened) of the GPU linear for bf16 inputs `x` [rows, in].
  std::vector<float> run_gpu(const Linear& l, const std::vector<uint16_t>& x, int64_t rows, bool bf16_out,
                             bool accumulate = false, const std::vector<float>* y0 = nullptr) {
    DeviceBuffer<uint16_t> dx(x);
    const int64_t out = l.out_features();
    DeviceBuffer<float> y32(static_cast<size_t>(rows * out));
    DeviceBuffer<uint16_t> y16(static_cast<size_t>(rows * out));
    if (y0) {
      y32.upload(*y0);
      std::vector<uint16_t> b(y0->size());
      for (size_t i = 0; i < b.size(); ++i) b[i] = kiln::cpu::float_to_bf16((*y0)[i]);
      y16.upload(b);
    }
    const size_t ws_bytes = l.workspace_bytes(rows, Epilogue::kNone);
    DeviceBuffer<char> ws(ws_bytes);
    LinearRun r;
    r.x = TensorView::contiguous(dx.get(), DType::kBF16, {rows, l.in_features()}, dev_->device());
    r.y = bf16_out ? TensorView::contiguous(y16.get(), DType::kBF16, {rows, out}, dev_->device())
                   : TensorView::contiguous(y32.get(), DType::kF32, {rows, out}, dev_->device());
    r.accumulate = accumulate;
    r.workspace = ws.get(), r.workspace_bytes = ws_bytes;
    const Status s = l.run(r, stream());
    EXPECT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(cudaStreamSynchronize(dev_->cuda_stream()), cudaSuccess);
    return bf16_out ? kiln::test::widen(y16.download()) : y32.download();
  }

  std::vector<float> run_cpu(const Linear& l, const std::vector<float>& x, int64_t rows) {
    std::vector<float> y(static_cast<size_t>(rows * l.out_features()));
    LinearRun r;
    r.x = TensorView::contiguous(const_cast<float*>(x.data()), DType::kF32, {rows, l.in_features()});
    r.y = TensorView::contiguous(y.data(), DType::kF32, {rows, l.out_features()});
    EXPECT_TRUE(l.run(r, {}).ok());
    return y;
  }

  std::unique_ptr<kiln::cuda::CudaDeviceContext> dev_;
  std::unique_ptr<WeightFormat> format_;
};

test::ModuleOptions options(int bits, int cb) {
  test::ModuleOptions o;
  o.bits = bits;
  o.codebook = static_cast<Codebook>(cb);
  return o;
}

TEST_F(Exl3Cuda, DecodeAndDequantizeAreBitExactForEveryKAndCodebook) {
  for (int bits = 1; bits <= 8; ++bits)
    for (int cb = 0; cb < 3; ++cb) {
      SCOPED_TRACE("K " + std::to_string(bits) + " codebook " + std::to_string(cb));
      test::MemorySource s;
      const int64_t in = 200, out = 300;  // padded to 256 × 384: crops and padding on both sides
      test::add_random_module(s, "m", in, out, options(bits, cb), 100 * bits + cb);
      auto m = read_module(s, "m", in, out);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      // Ŵ: the kernel's decode alone.
      const std::vector<float> want_w = decode_matrix(*m);
      const size_t words = static_cast<size_t>(m->k_pad / 16 * m->n_pad / 16 * 8 * bits);
      DeviceBuffer<uint32_t> trellis(words);
      KILN_CUDA_OK(cudaMemcpy(trellis.get(), m->trellis, words * 4, cudaMemcpyHostToDevice));
      DeviceBuffer<float> w(want_w.size());
      ASSERT_EQ(cuda::decode_matrix(trellis.get(), bits, cb, m->k_pad, m->n_pad, w.get(), nullptr), nullptr);
      const std::vector<float> got_w = w.download();
      ASSERT_EQ(0, std::memcmp(got_w.data(), want_w.data(), want_w.size() * 4));
      // W = (diag(suh)·Hb·Ŵ·Hb·diag(svh))ᵀ through the Linear, fp32 and bf16.
      auto l = gpu_linear(s, {"m"}, {out}, in);
      ASSERT_TRUE(l);
      const std::vector<float> want = dequantize(*m);
      DeviceBuffer<float> d(want.size());
      KILN_STATUS_OK(l->dequantize(TensorView::contiguous(d.get(), DType::kF32, {out, in}, dev_->device()), stream()));
      const std::vector<float> got = d.download();
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
      DeviceBuffer<uint16_t> d16(want.size());
      KILN_STATUS_OK(l->dequantize(TensorView::contiguous(d16.get(), DType::kBF16, {out, in}, dev_->device()), stream()));
      const std::vector<uint16_t> got16 = d16.download();
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got16[i], kiln::cpu::float_to_bf16(want[i])) << i;
    }
}

TEST_F(Exl3Cuda, ProductMatchesTheCpuReference) {
  std::mt19937_64 rng(3);
  for (int bits : {1, 2, 3, 4, 5, 6, 7, 8})
    for (int cb = 0; cb < 3; ++cb) {
      SCOPED_TRACE("K " + std::to_string(bits) + " codebook " + std::to_string(cb));
      test::MemorySource s;
      const int64_t in = 640, out = 520;
      test::ModuleOptions o = options(bits, cb);
      o.bias = bits % 2 == 0;
      test::add_random_module(s, "m", in, out, o, 7 * bits + cb);
      auto g = gpu_linear(s, {"m"}, {out}, in);
      auto c = cpu_linear(s, {"m"}, {out}, in);
      ASSERT_TRUE(g && c);
      for (int64_t rows : {1, 3, 8, 12, 21}) {
        const auto x = kiln::test::random_bf16(static_cast<size_t>(rows * in), rng);
        const auto want = run_cpu(*c, x.values, rows);
        EXPECT_LT(rel_error(run_gpu(*g, x.bits, rows, false), want), 1e-5) << rows << " rows, fp32 out";
        EXPECT_LT(rel_error(run_gpu(*g, x.bits, rows, true), want), 1e-2) << rows << " rows, bf16 out";
        // accumulate: y = y0 + x·Wᵀ
        const auto y0 = kiln::test::random_f32(want.size(), rng);
        std::vector<float> sum(want.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = y0[i] + want[i];
        EXPECT_LT(rel_error(run_gpu(*g, x.bits, rows, false, true, &y0), sum), 1e-5) << rows << " rows, accumulate";
      }
    }
}

TEST_F(Exl3Cuda, MixedStackOfExl3AndDenseModules) {
  test::MemorySource s;
  const int64_t in = 384;
  test::add_random_module(s, "a", in, 256, options(3, 2), 11);
  std::mt19937_64 rng(5);
  const auto w = kiln::test::random_bf16(static_cast<size_t>(100 * in), rng, -0.05f, 0.05f);
  s.add("b.weight", DType::kBF16, {100, in}, w.bits);
  test::add_random_module(s, "c", in, 130, options(5, 0), 12);
  auto g = gpu_linear(s, {"a", "b", "c"}, {256, 100, 130}, in);
  auto c = cpu_linear(s, {"a", "b", "c"}, {256, 100, 130}, in);
  ASSERT_TRUE(g && c);
  const auto x = kiln::test::random_bf16(static_cast<size_t>(5 * in), rng);
  EXPECT_LT(rel_error(run_gpu(*g, x.bits, 5, false), run_cpu(*c, x.values, 5)), 1e-5);
  // dequantize of the stack: EXL3 rows bit for bit, dense rows as stored (bf16 widened).
  std::vector<float> want(static_cast<size_t>(486 * in));
  KILN_STATUS_OK(c->dequantize(TensorView::contiguous(want.data(), DType::kF32, {486, in}), {}));
  DeviceBuffer<float> d(want.size());
  KILN_STATUS_OK(g->dequantize(TensorView::contiguous(d.get(), DType::kF32, {486, in}, dev_->device()), stream()));
  const auto got = d.download();
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
}

TEST_F(Exl3Cuda, RowsAreBatchInvariantAndGraphReplaysAreBitwise) {
  test::MemorySource s;
  const int64_t in = 2048, out = 1536;
  test::add_random_module(s, "m", in, out, options(4, 1), 21);
  auto g = gpu_linear(s, {"m"}, {out}, in);
  ASSERT_TRUE(g);
  std::mt19937_64 rng(9);
  const int64_t max_rows = 40;
  const auto x = kiln::test::random_bf16(static_cast<size_t>(max_rows * in), rng);
  const auto all = run_gpu(*g, x.bits, max_rows, true);
  for (int64_t rows = 1; rows <= max_rows; rows += rows < 8 ? 1 : 16) {
    std::vector<uint16_t> head(x.bits.begin(), x.bits.begin() + rows * in);
    const auto some = run_gpu(*g, head, rows, true);
    ASSERT_EQ(0, std::memcmp(some.data(), all.data(), some.size() * 4)) << rows << " rows";
  }
  // Capture one run into a graph; replays give the direct run's bits.
  const int64_t rows = 4;
  DeviceBuffer<uint16_t> dx(std::vector<uint16_t>(x.bits.begin(), x.bits.begin() + rows * in));
  DeviceBuffer<uint16_t> dy(static_cast<size_t>(rows * out));
  DeviceBuffer<char> ws(g->workspace_bytes(rows, Epilogue::kNone));
  LinearRun r;
  r.x = TensorView::contiguous(dx.get(), DType::kBF16, {rows, in}, dev_->device());
  r.y = TensorView::contiguous(dy.get(), DType::kBF16, {rows, out}, dev_->device());
  r.workspace = ws.get(), r.workspace_bytes = ws.size();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KILN_CUDA_OK(cudaStreamBeginCapture(dev_->cuda_stream(), cudaStreamCaptureModeGlobal));
  KILN_STATUS_OK(g->run(r, stream()));
  KILN_CUDA_OK(cudaStreamEndCapture(dev_->cuda_stream(), &graph));
  KILN_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    dy.poison();
    KILN_CUDA_OK(cudaGraphLaunch(exec, dev_->cuda_stream()));
    KILN_CUDA_OK(cudaStreamSynchronize(dev_->cuda_stream()));
    const auto got = kiln::test::widen(dy.download());
    ASSERT_EQ(0, std::memcmp(got.data(), all.data(), got.size() * 4)) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// gate and up of different K run as two launches, of one K and codebook as one launch (their column groups side by
// side): both against the CPU.
class Exl3CudaExperts : public Exl3Cuda, public ::testing::WithParamInterface<std::array<int, 4>> {};

TEST_P(Exl3CudaExperts, MatchTheCpuExpertSetAndAreInvariantPerToken) {
  const int64_t E = 6, H = 256, I = 200;
  const auto [gate_bits, gate_cb, up_bits, up_cb] = GetParam();
  test::MemorySource s;
  for (int64_t e = 0; e < E; ++e) {
    const std::string b = "x." + std::to_string(e) + ".";
    test::add_random_module(s, b + "gate_proj", H, I, options(gate_bits, gate_cb), 300 + e);
    test::add_random_module(s, b + "up_proj", H, I, options(up_bits, up_cb), 400 + e);
    test::add_random_module(s, b + "down_proj", I, H, options(2, 0), 500 + e);
  }
  ExpertSpec spec{"x", E, H, I};
  auto g = format_->load_experts(s, spec);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  std::vector<ExpertLinears> cpu_experts;
  for (int64_t e = 0; e < E; ++e) {
    const std::string b = "x." + std::to_string(e) + ".";
    ExpertLinears x;
    x.gate = cpu_linear(s, {b + "gate_proj"}, {I}, H);
    x.up = cpu_linear(s, {b + "up_proj"}, {I}, H);
    x.down = cpu_linear(s, {b + "down_proj"}, {H}, I);
    cpu_experts.push_back(std::move(x));
  }
  auto c = make_cpu_expert_set("x", std::move(cpu_experts), H, I);
  std::mt19937_64 rng(13);
  const int top_k = 3;
  const float limit = 7.0f;
  auto run_both = [&](int64_t n, const kiln::test::Bf16Data& x, const std::vector<int32_t>& ids,
                      const std::vector<float>& weights, std::vector<float>& gpu_out, std::vector<float>& cpu_out) {
    const int64_t pairs = n * top_k;
    cpu_out.assign(static_cast<size_t>(pairs * H), 0.0f);
    ExpertRun rc;
    rc.x = TensorView::contiguous(const_cast<float*>(x.values.data()), DType::kF32, {n, H});
    rc.routing.top_k = top_k, rc.routing.ids = ids.data(), rc.routing.weights = weights.data();
    rc.pair_out = cpu_out.data(), rc.swiglu_limit = limit;
    ASSERT_TRUE(c->run(rc, {}).ok());
    DeviceBuffer<uint16_t> dx(x.bits);
    DeviceBuffer<int32_t> did(ids);
    DeviceBuffer<float> dw(weights);
    DeviceBuffer<float> dout(static_cast<size_t>(pairs * H));
    DeviceBuffer<char> ws((*g)->workspace_bytes(n, top_k));
    ExpertRun r;
    r.x = TensorView::contiguous(dx.get(), DType::kBF16, {n, H}, dev_->device());
    r.routing.top_k = top_k, r.routing.ids = did.get(), r.routing.weights = dw.get();
    r.pair_out = dout.get(), r.swiglu_limit = limit, r.workspace = ws.get(), r.workspace_bytes = ws.size();
    auto folded = (*g)->run(r, stream());
    ASSERT_TRUE(folded.ok()) << folded.status().to_string();
    EXPECT_FALSE(*folded);
    gpu_out = dout.download();
  };
  const int64_t n = 9;
  const auto x = kiln::test::random_bf16(static_cast<size_t>(n * H), rng);
  std::vector<int32_t> ids(static_cast<size_t>(n * top_k));
  std::vector<float> weights(ids.size());
  for (size_t p = 0; p < ids.size(); ++p) ids[p] = static_cast<int32_t>((p * 5 + p / top_k) % E), weights[p] = 0.1f + 0.1f * (p % 4);
  std::vector<float> gpu_all, cpu_all;
  run_both(n, x, ids, weights, gpu_all, cpu_all);
  EXPECT_LT(rel_error(gpu_all, cpu_all), 1e-4);
  // Token 4 alone gives its pairs' bits from the 9-token call.
  kiln::test::Bf16Data one;
  one.bits.assign(x.bits.begin() + 4 * H, x.bits.begin() + 5 * H);
  one.values.assign(x.values.begin() + 4 * H, x.values.begin() + 5 * H);
  std::vector<int32_t> ids1(ids.begin() + 4 * top_k, ids.begin() + 5 * top_k);
  std::vector<float> w1(weights.begin() + 4 * top_k, weights.begin() + 5 * top_k);
  std::vector<float> gpu_one, cpu_one;
  run_both(1, one, ids1, w1, gpu_one, cpu_one);
  ASSERT_EQ(0, std::memcmp(gpu_one.data(), gpu_all.data() + 4 * top_k * H, gpu_one.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(GateAndUp, Exl3CudaExperts,
                         ::testing::Values(std::array<int, 4>{3, 1, 4, 2}, std::array<int, 4>{4, 1, 4, 1}));

// A Linear's consecutive EXL3 parts of one K and codebook share launches (at most kMaxParts each: five parts make
// two launches), a part of another K starts a new one; all against the CPU, with and without bias.
TEST_F(Exl3Cuda, StackedPartsOfOneKShareLaunchesAndMatchTheCpu) {
  test::MemorySource s;
  const int64_t in = 384;
  const std::vector<std::string> names = {"a", "b", "c", "d", "e", "f"};
  const std::vector<int64_t> outs = {256, 130, 200, 128, 64, 96};
  for (size_t i = 0; i < names.size(); ++i) {
    test::ModuleOptions o = options(i == 5 ? 3 : 4, 1);
    o.bias = i == 1 || i == 4;
    test::add_random_module(s, names[i], in, outs[i], o, 40 + static_cast<int>(i));
  }
  auto g = gpu_linear(s, names, outs, in);
  auto c = cpu_linear(s, names, outs, in);
  ASSERT_TRUE(g && c);
  std::mt19937_64 rng(17);
  for (int64_t rows : {1, 3, 9}) {
    const auto x = kiln::test::random_bf16(static_cast<size_t>(rows * in), rng);
    EXPECT_LT(rel_error(run_gpu(*g, x.bits, rows, false), run_cpu(*c, x.values, rows)), 1e-5) << rows << " rows";
  }
}

TEST_F(Exl3Cuda, ExpertsOfDifferentKPerProjectionAreRefusedNamingTheTensor) {
  test::MemorySource s;
  for (int64_t e = 0; e < 2; ++e) {
    const std::string b = "x." + std::to_string(e) + ".";
    test::add_random_module(s, b + "gate_proj", 128, 128, options(e == 1 ? 5 : 3, 1), 1 + e);
    test::add_random_module(s, b + "up_proj", 128, 128, options(3, 1), 3 + e);
    test::add_random_module(s, b + "down_proj", 128, 128, options(3, 1), 5 + e);
  }
  auto g = format_->load_experts(s, ExpertSpec{"x", 2, 128, 128});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().to_string().find("x.1.gate_proj"), std::string::npos) << g.status().to_string();
}

// Host-only (runs without a GPU): the split count is a valid cluster size and never exceeds the 128-input blocks
// (the kernel gives every split at least one), whatever the shape.
TEST(Exl3CudaSplits, OneClusterOfNonEmptySplits) {
  for (int64_t k_pad = 128; k_pad <= 20480; k_pad += 128) {
    for (const int splits : {cuda::product_splits(k_pad), cuda::expert_splits(k_pad)}) {
      ASSERT_GE(splits, 1);
      ASSERT_LE(splits, cuda::kMaxSplits) << k_pad;
      ASSERT_LE(splits, k_pad / 128) << k_pad;
    }
  }
  // Expert sets take longer splits (a warp's set-up amortised over more tiles): GLM-4.7-Flash's 2048 inputs in 4.
  EXPECT_EQ(cuda::expert_splits(2048), 4);
  EXPECT_EQ(cuda::expert_splits(1536), 3);
  EXPECT_EQ(cuda::expert_splits(128), 1);
}

class SyntheticSource : public WeightSource {
 public:
  bool has(const std::string&) const override { return true; }
  Result<TensorView> get(const std::string& name) const override { return not_found(name); }
  bool synthetic() const override { return true; }
  uint64_t seed() const override { return 1234; }
};

TEST_F(Exl3Cuda, DummyWeightsHaveTheInitializerStd) {
  SyntheticSource s;
  auto l = gpu_linear(s, {"q", "k"}, {512, 256}, 1024);
  ASSERT_TRUE(l);
  DeviceBuffer<float> d(static_cast<size_t>(768 * 1024));
  KILN_STATUS_OK(l->dequantize(TensorView::contiguous(d.get(), DType::kF32, {768, 1024}, dev_->device()), stream()));
  const auto w = d.download();
  double sq = 0;
  for (float v : w) sq += double(v) * v;
  const double std = std::sqrt(sq / w.size());
  EXPECT_GT(std, 0.015);
  EXPECT_LT(std, 0.025);
  auto e = format_->load_experts(s, ExpertSpec{"e", 4, 256, 128});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
}

}  // namespace
}  // namespace kiln::exl3
