#include "exl3_encoder.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>
#include <random>

#include "exl3_half.h"
#include "exl3_tile.h"
#include "exl3_viterbi.h"

namespace kiln::exl3 {
namespace {

int64_t pad128(int64_t v) { return (v + kHadamard - 1) / kHadamard * kHadamard; }

// A 128-block with only m real rows (or columns) rotates into values √(m/128) the size of a full block's; scaling
// those real channels up by √(128/m) keeps every rotated block at the same RMS, so one global scale fits all tiles.
float partial_block_factor(int64_t index, int64_t real) {
  const int64_t block_start = index / kHadamard * kHadamard;
  const int64_t m = std::min<int64_t>(kHadamard, real - block_start);
  return std::sqrt(static_cast<float>(m) / kHadamard);
}

// A non-zero scale representable as a normal fp16 (a zero channel keeps scale 1: its values are zero anyway).
float usable_scale(float rms) {
  if (!(rms > 0.0f) || !std::isfinite(rms)) return 1.0f;
  return std::clamp(rms, 1.0f / 8192.0f, 32768.0f);
}

// T = Hb · diag(1/row_scale) · m2 (the left rotation runs down each column, stride n).
std::vector<float> rotate_rows_in(const std::vector<float>& m2, int64_t k, int64_t n, const std::vector<float>& row_scale) {
  std::vector<float> t(m2.size());
  for (int64_t i = 0; i < k; ++i) {
    const float inv = 1.0f / row_scale[static_cast<size_t>(i)];
    for (int64_t j = 0; j < n; ++j) t[static_cast<size_t>(i * n + j)] = m2[static_cast<size_t>(i * n + j)] * inv;
  }
  for (int64_t j = 0; j < n; ++j) hadamard128(t.data() + j, k / kHadamard, n);
  return t;
}

// Tile (ti, tj)'s 256 targets in code order.
void gather_tile(const std::vector<float>& t, int64_t n, int64_t ti, int64_t tj, float gain, float* out) {
  const auto& perm = tile_permutation();
  for (int p = 0; p < kTileValues; ++p) {
    const int64_t r = perm[p] / kTile, c = perm[p] % kTile;
    out[p] = gain * t[static_cast<size_t>((ti * kTile + r) * n + tj * kTile + c)];
  }
}

float rms_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0.0f : static_cast<float>(std::sqrt(s / static_cast<double>(v.size())));
}

// The global scale g (targets g·T): a small grid around codebook RMS / target RMS, each candidate scored by the
// free-ended Viterbi error of a few evenly spread tiles, in the weight's units (÷ g²).
float search_scale(const std::vector<float>& t, int64_t k, int64_t n, const EncodeOptions& o, const float* values,
                   int threads) {
  constexpr std::array<float, 6> kGrid = {0.65f, 0.75f, 0.85f, 0.95f, 1.05f, 1.15f};
  constexpr int64_t kSamples = 4;
  const float base = rms_of(codebook_values(o.codebook)) / std::max(rms_of(t), 1e-12f);
  const int64_t tiles = (k / kTile) * (n / kTile), samples = std::min(kSamples, tiles);
  // Each (sample, candidate) error in its own slot, summed in a fixed order: the choice is the same for any
  // thread count, so a rerun writes the same bytes.
  std::vector<double> errors(static_cast<size_t>(samples) * kGrid.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t job = 0; job < static_cast<int64_t>(errors.size()); ++job) {
    thread_local ViterbiWorkspace ws;
    const int64_t s = job / static_cast<int64_t>(kGrid.size());
    const size_t g = static_cast<size_t>(job % static_cast<int64_t>(kGrid.size()));
    const int64_t tile = s * tiles / samples;
    float target[kTileValues];
    uint32_t states[kTileValues];
    const float gain = base * kGrid[g];
    gather_tile(t, n, tile / (n / kTile), tile % (n / kTile), gain, target);
    errors[static_cast<size_t>(job)] =
        viterbi_path(target, kTileValues, o.bits, values, -1, ws, states) / (double(gain) * gain);
  }
  std::array<double, kGrid.size()> err{};
  for (size_t job = 0; job < errors.size(); ++job) err[job % kGrid.size()] += errors[job];
  const size_t best = static_cast<size_t>(std::min_element(err.begin(), err.end()) - err.begin());
  return base * kGrid[best];
}

}  // namespace

const std::vector<float>& codebook_values(Codebook cb) {
  static std::array<std::vector<float>, 3> tables;
  static std::array<std::once_flag, 3> once;
  const size_t i = static_cast<size_t>(cb);
  std::call_once(once[i], [&] {
    tables[i].resize(1u << 16);
    for (uint32_t s = 0; s < (1u << 16); ++s) tables[i][s] = decode_state(s, cb);
  });
  return tables[i];
}

int64_t tile_count(int64_t out, int64_t in) { return (pad128(in) / kTile) * (pad128(out) / kTile); }

EncodedMatrix encode_matrix(const float* w, int64_t out, int64_t in, const EncodeOptions& o,
                            const std::function<void(int64_t)>& progress) {
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const int64_t k = pad128(in), n = pad128(out);
  EncodedMatrix r;
  r.k_pad = k;
  r.n_pad = n;
  r.bits = o.bits;
  std::mt19937_64 rng(o.seed);
  auto sign = [&] { return (rng() >> 63) ? -1.0f : 1.0f; };
  std::vector<float> su(static_cast<size_t>(k)), sv(static_cast<size_t>(n));
  for (auto& s : su) s = sign();
  for (auto& s : sv) s = sign();

  // Output channels (HF rows): svh = sign × RMS, rounded to fp16 before dividing so the encoder fits exactly what
  // the decoder will multiply back.
  r.svh.resize(static_cast<size_t>(n));
  std::vector<float> svh(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    float scale = 1.0f;
    if (j < out) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += double(w[j * in + i]) * w[j * in + i];
      scale = usable_scale(static_cast<float>(std::sqrt(s / static_cast<double>(in))) * partial_block_factor(j, out));
    }
    r.svh[static_cast<size_t>(j)] = float_to_half(sv[static_cast<size_t>(j)] * scale);
    svh[static_cast<size_t>(j)] = half_to_float(r.svh[static_cast<size_t>(j)]);
  }
  // m2 = (Wᵀ / svh) · Hb, k × n.
  std::vector<float> m2(static_cast<size_t>(k * n), 0.0f);
  for (int64_t j = 0; j < out; ++j)
    for (int64_t i = 0; i < in; ++i) m2[static_cast<size_t>(i * n + j)] = w[j * in + i] / svh[static_cast<size_t>(j)];
  for (int64_t i = 0; i < in; ++i) hadamard128(m2.data() + i * n, n / kHadamard);

  // Input channels: suh = sign × RMS of the rotated row, then ÷ g once g is known.
  std::vector<float> suh(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    float scale = 1.0f;
    if (i < in) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += double(m2[static_cast<size_t>(i * n + j)]) * m2[static_cast<size_t>(i * n + j)];
      scale = usable_scale(static_cast<float>(std::sqrt(s / static_cast<double>(n))) * partial_block_factor(i, in));
    }
    suh[static_cast<size_t>(i)] = su[static_cast<size_t>(i)] * scale;
  }
  const float* values = codebook_values(o.codebook).data();
  r.scale = search_scale(rotate_rows_in(m2, k, n, suh), k, n, o, values, threads);
  r.suh.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    r.suh[static_cast<size_t>(i)] = float_to_half(suh[static_cast<size_t>(i)] / r.scale);
    suh[static_cast<size_t>(i)] = half_to_float(r.suh[static_cast<size_t>(i)]);
  }
  const std::vector<float> t = rotate_rows_in(m2, k, n, suh);

  // The trellis, tile by tile; progress is reported between chunks, on this thread.
  const int64_t cols = n / kTile, tiles = (k / kTile) * cols, words = static_cast<int64_t>(kTile) * o.bits;
  r.trellis.assign(static_cast<size_t>(tiles * words), 0);
  // With a tile search of the caller's (the GPU), chunks of 4,096 tiles: gathered here, searched there, packed here;
  // a chunk it declines is searched on the CPU.
  bool device = static_cast<bool>(o.tile_search);
  const int64_t chunk = device ? 4096 : std::max<int64_t>(64, 16 * threads);
  std::vector<float> targets;
  std::vector<uint8_t> found;
  for (int64_t begin = 0; begin < tiles; begin += chunk) {
    const int64_t end = std::min(tiles, begin + chunk);
    if (device) {
      targets.resize(static_cast<size_t>((end - begin) * kTileValues));
      found.resize(targets.size());
#pragma omp parallel for num_threads(threads)
      for (int64_t tile = begin; tile < end; ++tile)
        gather_tile(t, n, tile / cols, tile % cols, 1.0f, targets.data() + (tile - begin) * kTileValues);
      device = o.tile_search(targets.data(), end - begin, o.bits, values, found.data());
      if (device) {
#pragma omp parallel for num_threads(threads)
        for (int64_t tile = begin; tile < end; ++tile)
          encode_symbols(found.data() + (tile - begin) * kTileValues, o.bits, r.trellis.data() + tile * words);
        if (progress) progress(end - begin);
        continue;
      }
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t tile = begin; tile < end; ++tile) {
      thread_local ViterbiWorkspace ws;
      float target[kTileValues];
      uint8_t symbols[kTileValues];
      gather_tile(t, n, tile / cols, tile % cols, 1.0f, target);
      viterbi_tile(target, o.bits, values, ws, symbols);
      encode_symbols(symbols, o.bits, r.trellis.data() + tile * words);
    }
    if (progress) progress(end - begin);
  }
  return r;
}

}  // namespace kiln::exl3
