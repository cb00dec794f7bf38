// The whole-matrix encoder: decode(encode(W)) through the plugin's own reader and dequantizer, relative RMS error
// per K on Gaussian weights (bounds ≈ 1.15× what was measured, in the table below and the README), reproducible bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "exl3_encoder.h"
#include "exl3_half.h"
#include "exl3_module.h"
#include "exl3_tile.h"
#include "exl3_viterbi.h"

namespace kiln::exl3 {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

double relative_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    r += double(b[i]) * b[i];
  }
  return std::sqrt(e / r);
}

std::vector<float> decode(const EncodedMatrix& e, Codebook cb, int64_t out, int64_t in) {
  Module m;
  m.in = in;
  m.out = out;
  m.k_pad = e.k_pad;
  m.n_pad = e.n_pad;
  m.bits = e.bits;
  m.codebook = cb;
  m.trellis = e.trellis.data();
  for (uint16_t h : e.suh) m.suh.push_back(half_to_float(h));
  for (uint16_t h : e.svh) m.svh.push_back(half_to_float(h));
  return dequantize(m);
}

// Measured (seed 7, 128 × 136 weight: one partial 128-block of inputs): MCG K2 0.259, K4 0.067, K6 0.0176, K8 0.0061;
// MUL1 K4 0.066, 3INST K4 0.068.
TEST(Exl3Encoder, RoundTripErrorPerK) {
  const int64_t out = 128, in = 136;
  const std::vector<float> w = gaussian(out * in, 11, 0.02f);
  struct Case { int bits; Codebook cb; double bound; };
  for (const Case c : {Case{2, Codebook::kMcg, 0.30}, Case{4, Codebook::kMcg, 0.080}, Case{6, Codebook::kMcg, 0.021},
                       Case{8, Codebook::kMcg, 0.0075}, Case{4, Codebook::kMul1, 0.080},
                       Case{4, Codebook::k3Inst, 0.080}}) {
    EncodeOptions o;
    o.bits = c.bits;
    o.codebook = c.cb;
    o.seed = 7;
    const EncodedMatrix e = encode_matrix(w.data(), out, in, o);
    ASSERT_EQ(e.trellis.size(), static_cast<size_t>(256 / 16 * 128 / 16 * 16 * c.bits));
    const double err = relative_rms(decode(e, c.cb, out, in), w);
    EXPECT_LT(err, c.bound) << "K " << c.bits << " " << codebook_name(c.cb);
    std::printf("K%d %s: relative RMS error %.4f\n", c.bits, codebook_name(c.cb), err);
  }
}

// Per tile, every K × codebook, Gaussian targets at 0.9 × the codebook's RMS (no scale search): each extra bit must
// shrink the error, within 1.2 · 2^(−0.93 K). Measured (all three codebooks alike): K1 0.54, K2 0.26-0.27, K3 0.134,
// K4 0.067, K5 0.034, K6 0.017, K7 0.009-0.013, K8 0.0044.
TEST(Exl3Encoder, TileErrorShrinksWithEveryBitForEveryCodebook) {
  for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
    const float* values = codebook_values(cb).data();
    double rms_cb = 0;
    for (int s = 0; s < 65536; ++s) rms_cb += double(values[s]) * values[s];
    rms_cb = std::sqrt(rms_cb / 65536);
    double previous = 1e9;
    for (int bits = 1; bits <= 8; ++bits) {
      ViterbiWorkspace ws;
      double err = 0, ref = 0;
      for (int tile = 0; tile < 2; ++tile) {
        const std::vector<float> t = gaussian(kTileValues, 100 * bits + tile, static_cast<float>(0.9 * rms_cb));
        uint8_t symbols[kTileValues];
        err += viterbi_tile(t.data(), bits, values, ws, symbols);
        for (float x : t) ref += double(x) * x;
      }
      const double rel = std::sqrt(err / ref);
      std::printf("%s K%d: tile relative RMS error %.4f\n", codebook_name(cb), bits, rel);
      EXPECT_LT(rel, previous) << codebook_name(cb) << " K" << bits;
      EXPECT_LT(rel, 1.2 * std::pow(2.0, -0.93 * bits)) << codebook_name(cb) << " K" << bits;
      previous = rel;
    }
  }
}

TEST(Exl3Encoder, SameSeedSameBytesAnyThreadCount) {
  const std::vector<float> w = gaussian(128 * 128, 2, 0.05f);
  EncodeOptions o;
  o.bits = 3;
  o.seed = 99;
  o.threads = 1;
  const EncodedMatrix a = encode_matrix(w.data(), 128, 128, o);
  o.threads = 2;
  const EncodedMatrix b = encode_matrix(w.data(), 128, 128, o);
  EXPECT_EQ(a.trellis, b.trellis);
  EXPECT_EQ(a.suh, b.suh);
  EXPECT_EQ(a.svh, b.svh);
  o.seed = 100;
  EXPECT_NE(encode_matrix(w.data(), 128, 128, o).suh, a.suh);
}

// The seam the GPU search plugs into (EncodeOptions::tile_search): chunks it searches are packed as it returns them,
// chunks it declines are searched on the CPU, and a search equal to the CPU's writes the CPU's bytes either way.
TEST(Exl3Encoder, TileSearchSeamWritesTheSameBytesAndFallsBackWhenDeclined) {
  const std::vector<float> w = gaussian(100 * 200, 4, 0.05f);  // padded to 128 × 256: 128 tiles
  EncodeOptions o;
  o.bits = 3;
  o.seed = 7;
  const EncodedMatrix cpu = encode_matrix(w.data(), 100, 200, o);
  int64_t searched = 0;
  o.tile_search = [&](const float* targets, int64_t tiles, int bits, const float* values, uint8_t* symbols) {
    ViterbiWorkspace ws;
    for (int64_t t = 0; t < tiles; ++t) viterbi_tile(targets + t * 256, bits, values, ws, symbols + t * 256);
    searched += tiles;
    return true;
  };
  const EncodedMatrix seam = encode_matrix(w.data(), 100, 200, o);
  EXPECT_EQ(searched, (256 / 16) * (128 / 16));
  EXPECT_EQ(seam.trellis, cpu.trellis);
  int declined = 0;
  o.tile_search = [&](const float*, int64_t, int, const float*, uint8_t* symbols) {
    symbols[0] ^= 1;  // a declined chunk's symbols are not used
    ++declined;
    return false;
  };
  const EncodedMatrix fallback = encode_matrix(w.data(), 100, 200, o);
  EXPECT_EQ(declined, 1);
  EXPECT_EQ(fallback.trellis, cpu.trellis);
}

}  // namespace
}  // namespace kiln::exl3
