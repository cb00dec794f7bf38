// The encoder's trellis search on the GPU against the CPU search (exl3_viterbi.h): the same symbols and the same
// squared errors, bit for bit, for K = 2..8 and every codebook (values from the table and decoded in registers), on targets at the codebook's scale and on outliers;
// and a whole weight encoded with the GPU search writes the CPU's bytes. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "exl3_encoder.h"
#include "exl3_viterbi.h"
#include "exl3_viterbi_cuda.h"

namespace kiln::exl3 {
namespace {

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

constexpr int kTargets = 256;

std::vector<float> random_targets(int64_t tiles, uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> t(static_cast<size_t>(tiles * kTargets));
  for (float& x : t) x = normal(rng);
  // A few outliers far outside the codebook's range, where many paths tie at the clamp.
  for (size_t i = 0; i < t.size(); i += 97) t[i] *= 8.0f;
  return t;
}

TEST(Exl3ViterbiCuda, SymbolsAndErrorsEqualTheCpuSearchForEveryKAndCodebook) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
    const std::vector<float>& values = codebook_values(cb);
    for (int bits = 2; bits <= 8; ++bits) {
      const int64_t tiles = bits <= 3 ? 6 : 12;
      const std::vector<float> targets = random_targets(tiles, 1000 * bits + static_cast<int>(cb), 1.0f);
      // The table read from memory (−1) and the values decoded in registers (the codebook's id).
      std::vector<uint8_t> gpu[2];
      std::vector<double> gpu_err[2];
      for (int mode = 0; mode < 2; ++mode) {
        gpu[mode].resize(static_cast<size_t>(tiles * kTargets));
        gpu_err[mode].resize(static_cast<size_t>(tiles));
        ASSERT_EQ(cuda::viterbi_tiles(targets.data(), tiles, bits, values.data(), gpu[mode].data(),
                                      gpu_err[mode].data(), mode == 0 ? -1 : static_cast<int>(cb)),
                  "");
      }
      ViterbiWorkspace ws;
      for (int64_t tile = 0; tile < tiles; ++tile) {
        uint8_t cpu[kTargets];
        const double err = viterbi_tile(targets.data() + tile * kTargets, bits, values.data(), ws, cpu);
        for (int mode = 0; mode < 2; ++mode) {
          EXPECT_EQ(err, gpu_err[mode][static_cast<size_t>(tile)])
              << codebook_name(cb) << " K=" << bits << " tile " << tile << " mode " << mode;
          for (int i = 0; i < kTargets; ++i)
            ASSERT_EQ(cpu[i], gpu[mode][static_cast<size_t>(tile * kTargets + i)])
                << codebook_name(cb) << " K=" << bits << " tile " << tile << " symbol " << i << " mode " << mode;
        }
      }
    }
  }
}

TEST(Exl3ViterbiCuda, OneBitIsLeftToTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> targets = random_targets(1, 7, 1.0f);
  std::vector<uint8_t> symbols(kTargets);
  EXPECT_NE(cuda::viterbi_tiles(targets.data(), 1, 1, codebook_values(Codebook::kMcg).data(), symbols.data(), nullptr)
                .find("2..8 bits"),
            std::string::npos);
}

TEST(Exl3ViterbiCuda, AWeightEncodedWithTheGpuSearchHasTheCpuBytes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // 200 × 300: both sides padded to multiples of 128 (256 × 384 → 384 tiles, one device chunk).
  const int64_t out = 200, in = 300;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(out * in));
  for (float& x : w) x = normal(rng);
  for (int bits : {3, 4}) {
    EncodeOptions o;
    o.bits = bits;
    o.codebook = Codebook::kMul1;
    o.seed = 5;
    const EncodedMatrix cpu = encode_matrix(w.data(), out, in, o, nullptr);
    int calls = 0;
    o.tile_search = [&](const float* targets, int64_t tiles, int k, const float* values, uint8_t* symbols) {
      ++calls;
      return cuda::viterbi_tiles(targets, tiles, k, values, symbols, nullptr, static_cast<int>(Codebook::kMul1)).empty();
    };
    const EncodedMatrix gpu = encode_matrix(w.data(), out, in, o, nullptr);
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(gpu.scale, cpu.scale);
    EXPECT_EQ(gpu.suh, cpu.suh);
    EXPECT_EQ(gpu.svh, cpu.svh);
    EXPECT_EQ(gpu.trellis, cpu.trellis) << "K=" << bits;
  }
}

}  // namespace
}  // namespace kiln::exl3
