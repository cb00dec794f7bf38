// RMSNorm, RoPE, SwiGLU, the bf16 → fp32 copy and the embedding gather against the CPU reference kernels.
#include <gtest/gtest.h>

#include "device_buffer.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::test {
namespace {

constexpr double kBf16Tolerance = 1e-2;  // bf16 outputs: rel ‖Δ‖/‖ref‖

TEST(GpuNorm, RmsNormMatchesCpu) {
  std::mt19937_64 rng(11);
  for (auto [n, dim] : {std::pair{1, 2048}, {7, 1000}, {3, 7168}, {5, 33}}) {
    const Bf16Data x = random_bf16(size_t(n) * dim, rng, -3.f, 3.f);
    const Bf16Data w = random_bf16(dim, rng, 0.5f, 1.5f);
    std::vector<float> want(x.values.size());
    cpu::rmsnorm(x.values.data(), w.values.data(), n, dim, 1e-5f, want.data());
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dout(x.bits.size());
    dout.poison();
    KILN_STATUS_OK(cuda::rmsnorm_bf16(dx.get(), dw.get(), n, dim, 1e-5f, dout.get(), nullptr));
    EXPECT_LT(rel_error(widen(dout.download()), want), kBf16Tolerance) << n << "x" << dim;
  }
}

// fp32 rows (strided, as q_a's slice of the shared q_a / kv_a GEMM output) normed as rmsnorm_bf16 norms their
// bf16 rounding: bitwise the same output.
TEST(GpuNorm, RoundedF32RowsNormExactlyAsTheirBf16Rounding) {
  std::mt19937_64 rng(13);
  for (auto [n, dim, stride] : {std::tuple{1, 768, 1344}, {5, 33, 40}, {3, 512, 512}}) {
    const std::vector<float> x = random_f32(size_t(n) * stride, rng, -3.f, 3.f);
    std::vector<uint16_t> rounded(size_t(n) * dim);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < dim; ++i) rounded[size_t(r) * dim + i] = cpu::float_to_bf16(x[size_t(r) * stride + i]);
    const Bf16Data w = random_bf16(dim, rng, 0.5f, 1.5f);
    DeviceBuffer<float> dx(x);
    DeviceBuffer<uint16_t> dr(rounded), dw(w.bits), got(rounded.size()), want(rounded.size());
    got.poison(), want.poison();
    KILN_STATUS_OK(cuda::rmsnorm_rounded_f32_bf16(dx.get(), stride, dw.get(), n, dim, 1e-6f, got.get(), nullptr));
    KILN_STATUS_OK(cuda::rmsnorm_bf16(dr.get(), dw.get(), n, dim, 1e-6f, want.get(), nullptr));
    EXPECT_EQ(got.download(), want.download()) << n << "x" << dim << " stride " << stride;
  }
  EXPECT_FALSE(cuda::rmsnorm_rounded_f32_bf16(nullptr, 10, nullptr, 1, 11, 1e-6f, nullptr, nullptr).ok());
}

TEST(GpuNorm, AddRmsNormUpdatesResidualAndNormalises) {
  std::mt19937_64 rng(12);
  for (auto [n, dim] : {std::pair{1, 2048}, {9, 6144}, {2, 77}}) {
    const Bf16Data x = random_bf16(size_t(n) * dim, rng);
    const Bf16Data w = random_bf16(dim, rng, 0.5f, 1.5f);
    std::vector<float> residual = random_f32(size_t(n) * dim, rng, -2.f, 2.f);
    DeviceBuffer<uint16_t> dx(x.bits), dw(w.bits), dout(x.bits.size());
    DeviceBuffer<float> dres(residual);
    dout.poison();
    KILN_STATUS_OK(cuda::add_rmsnorm_bf16(dx.get(), dres.get(), dw.get(), n, dim, 1e-5f, dout.get(), nullptr));
    std::vector<float> want(x.values.size());
    cpu::add_rmsnorm(x.values.data(), residual.data(), w.values.data(), n, dim, 1e-5f, want.data());
    EXPECT_LT(rel_error(dres.download(), residual), 1e-6);  // fp32 add, same operands
    EXPECT_LT(rel_error(widen(dout.download()), want), kBf16Tolerance);
  }
}

template <class T>
void check_rope(bool bf16) {
  std::mt19937_64 rng(bf16 ? 21 : 22);
  cpu::RopeConfig config;
  config.theta = 1e6;
  config.rotary_dim = 64;
  const std::vector<float> inv_freq = cpu::rope_inv_freq(config);
  // MLA q layout: [n, H, 192 nope + 64 rope]; only the rope slice turns.
  for (auto [n, heads] : {std::pair{1, 20}, {5, 64}, {3, 7}}) {
    const int64_t head_dim = 256, offset = 192;
    const Bf16Data x = random_bf16(size_t(n) * heads * head_dim, rng);
    std::vector<int64_t> positions(n);
    for (auto& p : positions) p = std::uniform_int_distribution<int64_t>(0, 200000)(rng);
    std::vector<float> want = x.values;
    std::vector<float> cos(size_t(n) * 32), sin(size_t(n) * 32);
    cpu::rope_cos_sin(inv_freq.data(), 32, 1.0, positions.data(), n, cos.data(), sin.data());
    cpu::apply_rope_interleaved(want.data() + offset, n, heads, heads * head_dim, head_dim, cos.data(), sin.data(), 64);
    DeviceBuffer<int64_t> dpos(positions);
    DeviceBuffer<float> dfreq(inv_freq);
    std::vector<float> got;
    if constexpr (sizeof(T) == 2) {
      DeviceBuffer<uint16_t> dx(x.bits);
      KILN_STATUS_OK(cuda::apply_rope_interleaved_bf16(dx.get() + offset, n, heads, heads * head_dim, head_dim,
                                                       dpos.get(), dfreq.get(), 1.0f, 64, nullptr));
      got = widen(dx.download());
      EXPECT_LT(rel_error(got, want), kBf16Tolerance);
    } else {
      DeviceBuffer<float> dx(x.values);
      KILN_STATUS_OK(cuda::apply_rope_interleaved_f32(dx.get() + offset, n, heads, heads * head_dim, head_dim,
                                                      dpos.get(), dfreq.get(), 1.0f, 64, nullptr));
      got = dx.download();
      EXPECT_LT(rel_error(got, want), 1e-5);
    }
    for (int64_t t = 0; t < n * heads; ++t)  // the nope part is untouched
      for (int64_t i = 0; i < offset; ++i) ASSERT_EQ(got[t * head_dim + i], x.values[t * head_dim + i]);
  }
}

TEST(GpuRope, InterleavedF32MatchesCpu) { check_rope<float>(false); }
TEST(GpuRope, InterleavedBf16MatchesCpu) { check_rope<uint16_t>(true); }

TEST(GpuActivation, SwigluFusedAndClampedMatchesCpu) {
  std::mt19937_64 rng(31);
  for (auto [n, inter, limit] : {std::tuple{1, 1536, INFINITY}, {6, 1000, 10.f}, {3, 37, 0.5f}}) {
    const Bf16Data gu = random_bf16(size_t(n) * 2 * inter, rng, -12.f, 12.f);
    std::vector<float> want(size_t(n) * inter);
    cpu::swiglu(gu.values.data(), gu.values.data() + inter, n, inter, 2 * inter, want.data(), limit);
    DeviceBuffer<uint16_t> dgu(gu.bits), dout(want.size());
    dout.poison();
    KILN_STATUS_OK(cuda::swiglu_bf16(dgu.get(), dgu.get() + inter, n, inter, 2 * inter, dout.get(), nullptr, limit));
    EXPECT_LT(rel_error(widen(dout.download()), want), kBf16Tolerance);
  }
}

// Rows of multiples of 8 run eight values a thread; the same rows one element off alignment run one a thread: the
// same bits.
TEST(GpuActivation, SwigluVectorFormIsBitwiseTheScalarForm) {
  std::mt19937_64 rng(32);
  const int64_t n = 37, inter = 1536;
  const Bf16Data gu = random_bf16(size_t(n) * 2 * inter + 1, rng, -12.f, 12.f);
  DeviceBuffer<uint16_t> dgu(gu.bits), vec(size_t(n) * inter), scalar(size_t(n) * inter);
  std::vector<uint16_t> shifted(gu.bits.size());
  std::copy(gu.bits.begin(), gu.bits.end() - 1, shifted.begin() + 1);
  DeviceBuffer<uint16_t> dshifted(shifted);
  vec.poison(), scalar.poison();
  KILN_STATUS_OK(cuda::swiglu_bf16(dgu.get(), dgu.get() + inter, n, inter, 2 * inter, vec.get(), nullptr, 7.f));
  KILN_STATUS_OK(
      cuda::swiglu_bf16(dshifted.get() + 1, dshifted.get() + 1 + inter, n, inter, 2 * inter, scalar.get(), nullptr, 7.f));
  EXPECT_EQ(vec.download(), scalar.download());
}

// The MoE gate's fp32 copy: eight values a thread where aligned, one a thread elsewhere; exact either way.
TEST(GpuConvert, Bf16ToF32IsExactInBothForms) {
  std::mt19937_64 rng(33);
  const Bf16Data x = random_bf16(4096 * 8 + 9, rng, -100.f, 100.f);
  DeviceBuffer<uint16_t> dx(x.bits);
  for (const size_t offset : {size_t{0}, size_t{1}})
    for (const size_t n : {size_t{4096 * 8}, size_t{4096 * 8 + 5}}) {
      DeviceBuffer<float> out(n);
      out.poison();
      KILN_STATUS_OK(cuda::bf16_to_f32(dx.get() + offset, n, out.get(), nullptr));
      const std::vector<float> want(x.values.begin() + offset, x.values.begin() + offset + n);
      EXPECT_EQ(out.download(), want) << "offset " << offset << " n " << n;
    }
}

TEST(GpuEmbedding, GatherCopiesRowsExactly) {
  std::mt19937_64 rng(41);
  for (auto [vocab, dim] : {std::pair{1000, 2048}, {77, 13}}) {
    const Bf16Data table = random_bf16(size_t(vocab) * dim, rng);
    std::vector<int32_t> ids = {0, vocab - 1, 5, 5, 42 % vocab, -3};
    DeviceBuffer<uint16_t> dtable(table.bits), dout(ids.size() * dim);
    DeviceBuffer<int32_t> dids(ids);
    dout.poison();
    KILN_STATUS_OK(cuda::embedding_gather_bf16(dtable.get(), vocab, dim, dids.get(), ids.size(), dout.get(), nullptr));
    const auto got = dout.download();
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t i = 0; i < dim; ++i)
        ASSERT_EQ(got[t * dim + i], ids[t] < 0 ? 0 : table.bits[size_t(ids[t]) * dim + i]) << t << "," << i;
  }
}

}  // namespace
}  // namespace kiln::test
