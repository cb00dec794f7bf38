// The few-row tensor-core GEMM (decode projections) and CublasGemm::linear's dispatch to it, against the CPU
// reference: every tile shape (n up to 64, one or two 16-row tiles per block, 8 or 16 warps), odd sizes, k
// tails, bf16 / fp32 outputs, accumulate, 4 or 8 chunks per warp in flight, and back-to-back calls that overlap
// through programmatic dependent launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "device_buffer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/skinny_gemm.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::test {
namespace {

// fp32 output: only the summation order differs from the CPU (< 1e-5 relative); bf16 output adds one rounding
// (2^-8 relative per element, < 5e-3 over a vector).
constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 5e-3;

struct Shape {
  int64_t n, in, out;
};

void check_shape(const Shape& s, int sm_count, std::mt19937_64& rng) {
  const Bf16Data x = random_bf16(size_t(s.n) * s.in, rng);
  const Bf16Data w = random_bf16(size_t(s.out) * s.in, rng, -0.05f, 0.05f);
  const Bf16Data y0 = random_bf16(size_t(s.n) * s.out, rng);  // what accumulate adds to
  std::vector<float> want(size_t(s.n) * s.out), want_acc(want.size());
  cpu::gemm_bf16(x.values.data(), s.n, s.in, w.bits.data(), s.out, want.data());
  for (size_t i = 0; i < want.size(); ++i) want_acc[i] = want[i] + y0.values[i];
  DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dy16(want.size());
  DeviceBuffer<float> dy32(want.size());
  const std::string what = "n " + std::to_string(s.n) + " in " + std::to_string(s.in) + " out " +
                           std::to_string(s.out) + " sms " + std::to_string(sm_count);

  dy16.poison();
  dy32.poison();
  KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), s.n, s.in, dw.get(), s.out, dy16.get(), DType::kBF16, false,
                                        sm_count, nullptr));
  KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), s.n, s.in, dw.get(), s.out, dy32.get(), DType::kF32, false,
                                        sm_count, nullptr));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(rel_error(widen(dy16.download()), want), kTolBf16) << what;  // poison is NaN: every element written
  EXPECT_LT(rel_error(dy32.download(), want), kTolF32) << what;

  dy16.upload(y0.bits);
  dy32.upload(y0.values);
  KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), s.n, s.in, dw.get(), s.out, dy16.get(), DType::kBF16, true,
                                        sm_count, nullptr));
  KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), s.n, s.in, dw.get(), s.out, dy32.get(), DType::kF32, true,
                                        sm_count, nullptr));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(rel_error(widen(dy16.download()), want_acc), kTolBf16) << what << " accumulate";
  EXPECT_LT(rel_error(dy32.download(), want_acc), kTolF32) << what << " accumulate";
}

TEST(GpuSkinnyGemm, MatchesCpuOnEveryTileShape) {
  std::mt19937_64 rng(91);
  const std::vector<Shape> shapes = {
      {1, 2048, 768},  {1, 8, 1},      {3, 776, 1001}, {8, 520, 17},   {9, 2048, 576},
      {16, 1536, 33},  {17, 264, 130}, {32, 5120, 64}, {33, 96, 2048}, {64, 256, 100},
      {3, 5120, 1001}, {9, 2056, 300},  // k over one round of 16 warps × 4 chunks: 8 chunks per warp in flight
  };
  // sm_count steers the block shape: 1 → two 16-row tiles per block wherever out ≥ 64; 100000 → one tile and
  // 16 warps; 132 → what an H200 gets.
  for (const Shape& s : shapes)
    for (int sms : {1, 132, 100000}) check_shape(s, sms, rng);
}

TEST(GpuSkinnyGemm, RejectsWhatItCannotRun) {
  DeviceBuffer<uint16_t> buf(4096);
  float* y = nullptr;
  EXPECT_FALSE(cuda::skinny_gemm_supported(buf.get(), 65, 64, buf.get()));
  EXPECT_FALSE(cuda::skinny_gemm_supported(buf.get(), 1, 12, buf.get()));
  EXPECT_FALSE(cuda::skinny_gemm_supported(buf.get() + 1, 1, 64, buf.get()));
  EXPECT_TRUE(cuda::skinny_gemm_supported(buf.get(), 64, 64, buf.get()));
  EXPECT_FALSE(cuda::skinny_gemm_bf16(buf.get(), 0, 64, buf.get(), 8, y, DType::kF32, false, 132, nullptr).ok());
}

// linear() keeps its contract whichever path runs: skinny where skinny_gemm_preferred, cuBLAS elsewhere or for
// operands the skinny kernel cannot take (in % 8 != 0).
TEST(GpuSkinnyGemm, LinearDispatchMatchesCpu) {
  std::mt19937_64 rng(92);
  auto gemm = cuda::CublasGemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  for (auto [n, in, out] : {std::tuple{1, 2048, 3000}, {4, 5120, 2048}, {32, 768, 640}, {33, 512, 300},
                            {5, 12, 50}, {2, 2048, 40000}, {16, 256, 20000}}) {
    const Bf16Data x = random_bf16(size_t(n) * in, rng);
    const Bf16Data w = random_bf16(size_t(out) * in, rng, -0.05f, 0.05f);
    const Bf16Data y0 = random_bf16(size_t(n) * out, rng);
    std::vector<float> want(size_t(n) * out);
    cpu::gemm_bf16(x.values.data(), n, in, w.bits.data(), out, want.data());
    for (size_t i = 0; i < want.size(); ++i) want[i] += y0.values[i];
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dy16(y0.bits);
    DeviceBuffer<float> dy32(y0.values);
    KILN_STATUS_OK((*gemm)->linear(dx.get(), n, in, dw.get(), out, dy16.get(), DType::kBF16, nullptr, true));
    KILN_STATUS_OK((*gemm)->linear(dx.get(), n, in, dw.get(), out, dy32.get(), DType::kF32, nullptr, true));
    EXPECT_LT(rel_error(widen(dy16.download()), want), kTolBf16) << n << "/" << in << "/" << out;
    EXPECT_LT(rel_error(dy32.download(), want), 1e-4) << n << "/" << in << "/" << out;  // cuBLAS: 1e-4 as before
  }
}

// Batch invariance (what makes GPU speculative verification lossless): up to kSkinnyGemmMaxRows rows, a row's
// outputs are bitwise those of the row computed alone, wherever it sits among the others, for every block shape.
TEST(GpuSkinnyGemm, EachRowIsBitwiseIndependentOfTheOtherRows) {
  std::mt19937_64 rng(93);
  constexpr int64_t kRows = cuda::kSkinnyGemmMaxRows;
  for (auto [in, out] : {std::pair<int64_t, int64_t>{2048, 768}, {520, 17}, {5120, 64}, {96, 2048}, {2048, 16384}}) {
    const Bf16Data x = random_bf16(size_t(kRows) * in, rng);
    const Bf16Data w = random_bf16(size_t(out) * in, rng, -0.05f, 0.05f);
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dy16(size_t(kRows) * out);
    DeviceBuffer<float> dy32(size_t(kRows) * out);
    for (int sms : {1, 132, 100000}) {
      // Row r alone (x row r is x + r·in).
      std::vector<float> alone32(size_t(kRows) * out);
      std::vector<uint16_t> alone16(alone32.size());
      for (int64_t r = 0; r < kRows; ++r) {
        KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get() + r * in, 1, in, dw.get(), out, dy32.get(), DType::kF32, false,
                                              sms, nullptr));
        KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get() + r * in, 1, in, dw.get(), out, dy16.get(), DType::kBF16,
                                              false, sms, nullptr));
        const auto y32 = dy32.download();
        const auto y16 = dy16.download();
        std::copy_n(y32.begin(), out, alone32.begin() + r * out);
        std::copy_n(y16.begin(), out, alone16.begin() + r * out);
      }
      for (int64_t n : {2, 3, 7, 8, 9, 16, 17, 24, 31, 32}) {
        KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), n, in, dw.get(), out, dy32.get(), DType::kF32, false, sms,
                                              nullptr));
        KILN_STATUS_OK(cuda::skinny_gemm_bf16(dx.get(), n, in, dw.get(), out, dy16.get(), DType::kBF16, false, sms,
                                              nullptr));
        const auto y32 = dy32.download();
        const auto y16 = dy16.download();
        for (int64_t r = 0; r < n; ++r) {
          EXPECT_EQ(0, std::memcmp(y32.data() + r * out, alone32.data() + r * out, out * sizeof(float)))
              << "fp32: row " << r << " of " << n << ", in " << in << " out " << out << " sms " << sms;
          EXPECT_EQ(0, std::memcmp(y16.data() + r * out, alone16.data() + r * out, out * sizeof(uint16_t)))
              << "bf16: row " << r << " of " << n << ", in " << in << " out " << out << " sms " << sms;
        }
      }
    }
  }
}

// Tensor parallelism (a rank computes a column-sharded part of W's rows) and the block shape: an output's bits
// depend on its W row and x row alone. The whole W and row ranges of it (a TP=2 / TP=3 rank's part, which has
// fewer tiles and so may get another warp count or tile pairing), under every block shape (sm_count 1: two tiles
// of 8 warps; 132: what an H200 picks; 100000: one tile of 16 warps), and 33..64 rows against the row alone.
TEST(GpuSkinnyGemm, AnOutputIsBitwiseTheSameWhateverTheShardAndBlockShape) {
  std::mt19937_64 rng(97);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{256, 4096}, {2048, 768}, {5120, 2112}, {520, 300}}) {
    constexpr int64_t kRows = cuda::kSkinnyGemmLimit;
    const Bf16Data x = random_bf16(size_t(kRows) * in, rng);
    const Bf16Data w = random_bf16(size_t(out) * in, rng, -0.05f, 0.05f);
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits);
    DeviceBuffer<float> dy(size_t(kRows) * out);
    auto run = [&](int64_t n, int64_t x_row0, int64_t row0, int64_t rows, int sms) {
      dy.poison();
      const Status st = cuda::skinny_gemm_bf16(dx.get() + x_row0 * in, n, in, dw.get() + row0 * in, rows, dy.get(),
                                               DType::kF32, false, sms, nullptr);
      EXPECT_TRUE(st.ok()) << st.message();
      auto y = dy.download();
      y.resize(size_t(n) * rows);
      return y;
    };
    for (int64_t n : {int64_t{1}, int64_t{8}, int64_t{33}, kRows}) {
      const std::vector<float> whole = run(n, 0, 0, out, 132);
      for (int sms : {1, 132, 100000})
        for (int parts : {1, 2, 3}) {
          const int64_t per = (out + parts - 1) / parts;
          for (int64_t row0 = 0; row0 < out; row0 += per) {
            const int64_t rows = std::min(per, out - row0);
            const std::vector<float> part = run(n, 0, row0, rows, sms);
            for (int64_t r = 0; r < n; ++r)
              ASSERT_EQ(0, std::memcmp(part.data() + r * rows, whole.data() + r * out + row0, rows * sizeof(float)))
                  << "in " << in << " out " << out << " n " << n << " sms " << sms << ": rows " << row0 << ".."
                  << row0 + rows << " of " << parts << " parts, x row " << r;
          }
        }
      if (n > cuda::kSkinnyGemmMaxRows)  // 33..64 rows: each row as it comes alone
        for (int64_t r : {int64_t{0}, n / 2, n - 1}) {
          const std::vector<float> alone = run(1, r, 0, out, 132);
          ASSERT_EQ(0, std::memcmp(alone.data(), whole.data() + r * out, out * sizeof(float)))
              << "in " << in << " out " << out << ": row " << r << " of " << n << " vs alone";
        }
    }
  }
}

struct MlaShape {
  int64_t heads, nope, rope, v, latent;
};

// MLA's per-head absorption products as the CUDA runner runs them in batch-invariant steps: the strided batch over
// heads against the CPU (q_lat[t, h] = W_UK[h]ᵀ·q_nope[t, h] through the transposed W_UK, fp32 out;
// attn[t, h] = W_UV[h]·o_lat[t, h], bf16 out), and every row bitwise equal to the row run alone.
TEST(GpuSkinnyGemm, PerHeadAbsorptionProductsMatchCpuAndAreBatchInvariant) {
  std::mt19937_64 rng(94);
  // GLM-4.7-Flash, tiny-glm and the glm4_moe_lite-tiny fixture.
  for (const MlaShape& m : {MlaShape{20, 192, 64, 256, 512}, MlaShape{8, 32, 16, 32, 128}, MlaShape{4, 16, 8, 16, 32}}) {
    const int64_t H = m.heads, qk = m.nope + m.rope, D = m.latent + m.rope, L = m.latent;
    const Bf16Data kv_b = random_bf16(size_t(H * (m.nope + m.v)) * L, rng, -0.05f, 0.05f);
    DeviceBuffer<uint16_t> d_kv_b(kv_b.bits), d_uk_t(size_t(H) * L * m.nope);
    KILN_STATUS_OK(cuda::mla_transpose_w_uk(d_kv_b.get(), H, m.nope, m.v, L, d_uk_t.get(), nullptr));
    const auto uk_t = d_uk_t.download();
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t i = 0; i < m.nope; ++i)
          ASSERT_EQ(uk_t[(h * L + l) * m.nope + i], kv_b.bits[(h * (m.nope + m.v) + i) * L + l]) << h << " " << l << " " << i;

    constexpr int64_t kMaxRows = cuda::kSkinnyGemmMaxRows;
    const Bf16Data q = random_bf16(size_t(kMaxRows) * H * qk, rng);
    const Bf16Data o = random_bf16(size_t(kMaxRows) * H * L, rng);
    DeviceBuffer<uint16_t> dq(q.bits), d_o(o.bits), d_attn(size_t(kMaxRows) * H * m.v);
    DeviceBuffer<float> d_qabs(size_t(kMaxRows) * H * D);
    auto absorb = [&](int64_t n, int64_t first_row) {
      cuda::SkinnyStrides s;
      s.batches = H, s.x_row = H * qk, s.x_batch = qk, s.w_batch = L * m.nope, s.y_row = H * D, s.y_batch = D;
      return cuda::skinny_gemm_strided_batched_bf16(dq.get() + first_row * H * qk, n, m.nope, d_uk_t.get(), L,
                                                    d_qabs.get(), DType::kF32, s, false, 132, nullptr);
    };
    auto unabsorb = [&](int64_t n, int64_t first_row) {
      cuda::SkinnyStrides s;
      s.batches = H, s.x_row = H * L, s.x_batch = L, s.w_batch = (m.nope + m.v) * L, s.y_row = H * m.v,
      s.y_batch = m.v;
      return cuda::skinny_gemm_strided_batched_bf16(d_o.get() + first_row * H * L, n, L, d_kv_b.get() + m.nope * L,
                                                    m.v, d_attn.get(), DType::kBF16, s, false, 132, nullptr);
    };
    // Row t alone, then batches of n rows.
    std::vector<float> alone_q(size_t(kMaxRows) * H * L);
    std::vector<uint16_t> alone_attn(size_t(kMaxRows) * H * m.v);
    for (int64_t t = 0; t < kMaxRows; ++t) {
      KILN_STATUS_OK(absorb(1, t));
      KILN_STATUS_OK(unabsorb(1, t));
      const auto qa = d_qabs.download();
      const auto at = d_attn.download();
      for (int64_t h = 0; h < H; ++h) std::copy_n(qa.begin() + h * D, L, alone_q.begin() + (t * H + h) * L);
      std::copy_n(at.begin(), H * m.v, alone_attn.begin() + t * H * m.v);
    }
    for (int64_t n : {1, 5, 8, 17, 32}) {
      d_qabs.poison();
      d_attn.poison();
      KILN_STATUS_OK(absorb(n, 0));
      KILN_STATUS_OK(unabsorb(n, 0));
      const auto qa = d_qabs.download();
      const auto at = d_attn.download();
      std::vector<float> got_q, want_q, got_a, want_a;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t l = 0; l < L; ++l) {
            double acc = 0;
            for (int64_t i = 0; i < m.nope; ++i)
              acc += double(kv_b.values[(h * (m.nope + m.v) + i) * L + l]) * q.values[t * H * qk + h * qk + i];
            want_q.push_back(static_cast<float>(acc));
            got_q.push_back(qa[(t * H + h) * D + l]);
          }
          for (int64_t j = 0; j < m.v; ++j) {
            double acc = 0;
            for (int64_t l = 0; l < L; ++l)
              acc += double(kv_b.values[(h * (m.nope + m.v) + m.nope + j) * L + l]) * o.values[(t * H + h) * L + l];
            want_a.push_back(static_cast<float>(acc));
            got_a.push_back(cpu::bf16_to_float(at[(t * H + h) * m.v + j]));
          }
        }
      const std::string what = "heads " + std::to_string(H) + " latent " + std::to_string(L) + " n " + std::to_string(n);
      EXPECT_LT(rel_error(got_q, want_q), kTolF32) << what;
      EXPECT_LT(rel_error(got_a, want_a), kTolBf16) << what;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < H; ++h)
          EXPECT_EQ(0, std::memcmp(qa.data() + (t * H + h) * D, alone_q.data() + (t * H + h) * L, L * sizeof(float)))
              << what << ": q_lat row " << t << " head " << h;
        EXPECT_EQ(0, std::memcmp(at.data() + t * H * m.v, alone_attn.data() + t * H * m.v, H * m.v * sizeof(uint16_t)))
            << what << ": attn row " << t;
      }
    }
  }
}

// Programmatic dependent launch: calls issued back to back on one stream, each reading what the call before it
// wrote (x, and y when accumulating), give bitwise what the same calls give with the stream synchronised after
// each one. The chain starts with a 128 MB weight (tens of µs), so a successor that read its input before the
// wait would see the poison the outputs start as.
TEST(GpuSkinnyGemm, BackToBackCallsReadTheirPredecessorsOutput) {
  std::mt19937_64 rng(97);
  constexpr int64_t kIn = 2048, kWide = 32768, kMid = 4096, kInter = 1024, kOut = 2048, kHeads = 4, kHeadIn = 256,
                    kHeadOut = 120;
  static_assert(kHeads * kHeadIn == kInter);
  DeviceBuffer<uint16_t> w0(kWide * kIn), w1(kMid * kIn), wg(2 * kInter * kMid), w3(kOut * kInter), w4(kOut * kIn),
      w5(kHeads * kHeadOut * kHeadIn);
  uint64_t seed = 970;
  for (DeviceBuffer<uint16_t>* w : {&w0, &w1, &wg, &w3, &w4, &w5})
    KILN_STATUS_OK(cuda::fill_uniform_bf16(w->get(), w->size(), 0.05f, seed++, nullptr));
  // The fills ran on the legacy default stream, which the non-blocking stream below does not wait for.
  KILN_CUDA_OK(cudaDeviceSynchronize());
  cudaStream_t stream = nullptr;
  KILN_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int64_t n : {1, 3, 8, 17, 32}) {
    const Bf16Data x = random_bf16(size_t(n) * kIn, rng);
    DeviceBuffer<uint16_t> dx(x.bits), h0(n * kWide), h1(n * kMid), act(n * kInter), z(n * kHeads * kHeadOut);
    DeviceBuffer<float> y(n * kOut);
    // h0 = x·W0ᵀ; h1 = h0[:, :kIn]·W1ᵀ; act = SwiGLU(h1·Wgᵀ); z = per-head act·W5[h]ᵀ; y = act·W3ᵀ; y += x·W4ᵀ.
    auto chain = [&](bool sync_each) {
      for (DeviceBuffer<uint16_t>* b : {&h0, &h1, &act, &z})
        KILN_CUDA_OK(cudaMemsetAsync(b->get(), 0xff, b->size() * sizeof(uint16_t), stream));
      KILN_CUDA_OK(cudaMemsetAsync(y.get(), 0xff, y.size() * sizeof(float), stream));
      auto step = [&](Status st) {
        KILN_STATUS_OK(st);
        if (sync_each) KILN_CUDA_OK(cudaStreamSynchronize(stream));
      };
      step(cuda::skinny_gemm_bf16(dx.get(), n, kIn, w0.get(), kWide, h0.get(), DType::kBF16, false, 132, stream));
      cuda::SkinnyStrides narrow;
      narrow.x_row = kWide, narrow.y_row = kMid;
      step(cuda::skinny_gemm_strided_batched_bf16(h0.get(), n, kIn, w1.get(), kMid, h1.get(), DType::kBF16, narrow,
                                                  false, 132, stream));
      step(cuda::skinny_gemm_swiglu_bf16(h1.get(), n, kMid, wg.get(), kInter, act.get(), stream));
      cuda::SkinnyStrides heads;
      heads.batches = kHeads, heads.x_row = kInter, heads.x_batch = kHeadIn, heads.w_batch = kHeadOut * kHeadIn,
      heads.y_row = kHeads * kHeadOut, heads.y_batch = kHeadOut;
      step(cuda::skinny_gemm_strided_batched_bf16(act.get(), n, kHeadIn, w5.get(), kHeadOut, z.get(), DType::kBF16,
                                                  heads, false, 132, stream));
      step(cuda::skinny_gemm_bf16(act.get(), n, kInter, w3.get(), kOut, y.get(), DType::kF32, false, 132, stream));
      step(cuda::skinny_gemm_bf16(dx.get(), n, kIn, w4.get(), kOut, y.get(), DType::kF32, true, 132, stream));
      KILN_CUDA_OK(cudaStreamSynchronize(stream));
    };
    chain(true);
    const auto h0_s = h0.download(), h1_s = h1.download(), act_s = act.download(), z_s = z.download();
    const auto y_s = y.download();
    auto finite = [](const std::vector<float>& v) {
      return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); });
    };
    for (const auto* v : {&h0_s, &h1_s, &act_s, &z_s}) ASSERT_TRUE(finite(widen(*v))) << "n " << n;
    ASSERT_TRUE(finite(y_s)) << "n " << n;  // the synchronised chain wrote every element
    chain(false);
    EXPECT_EQ(h0.download(), h0_s) << "n " << n;
    EXPECT_EQ(h1.download(), h1_s) << "n " << n;
    EXPECT_EQ(act.download(), act_s) << "n " << n;
    EXPECT_EQ(z.download(), z_s) << "n " << n;
    EXPECT_EQ(0, std::memcmp(y.download().data(), y_s.data(), y_s.size() * sizeof(float))) << "n " << n;
  }
  KILN_CUDA_OK(cudaStreamDestroy(stream));
}

TEST(GpuSkinnyGemm, StridedBatchRejectsMisalignedStrides) {
  DeviceBuffer<uint16_t> buf(4096);
  DeviceBuffer<float> y(4096);
  cuda::SkinnyStrides s;
  s.batches = 2, s.x_row = 68, s.x_batch = 4, s.w_batch = 64, s.y_row = 8, s.y_batch = 8;
  EXPECT_FALSE(cuda::skinny_gemm_strided_batched_bf16(buf.get(), 2, 64, buf.get(), 8, y.get(), DType::kF32, s, false,
                                                      132, nullptr)
                   .ok());  // x_row % 8 != 0
  s.x_row = 64, s.x_batch = 8, s.y_row = 4;
  EXPECT_FALSE(cuda::skinny_gemm_strided_batched_bf16(buf.get(), 2, 64, buf.get(), 8, y.get(), DType::kF32, s, false,
                                                      132, nullptr)
                   .ok());  // y_row < out
}

}  // namespace
}  // namespace kiln::test
