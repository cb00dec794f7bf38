#include "exl3_viterbi.h"

#include <algorithm>

#include "exl3_tile.h"

namespace kiln::exl3 {
namespace {

// The sweep is the encoder's whole cost; built once per instruction set and picked at load time (GCC function
// multiversioning), so a portable binary still runs it with AVX2 / AVX-512 where the CPU has them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_EXL3_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KILN_EXL3_SIMD_CLONES
#endif

// Larger than any real path's cost, and finite, so sums stay ordered (no inf − inf) under any float mode.
constexpr float kUnreachable = 1e30f;

// One step: next[e] = min over hi of spread[s] + (values[s] − w)², s = hi·2^(16−K) + e, with spread[s] = cost[s >> K];
// back[e] = the argmin hi. Contiguous sweeps without branches; the argmin is carried as a float beside the cost (same
// width, so the select vectorises) and narrowed to bytes once per step.
KILN_EXL3_SIMD_CLONES void step(const float* __restrict cost, float w, int bits, const float* __restrict values, float* __restrict spread,
          float* __restrict next, float* __restrict best_hi, uint8_t* __restrict back) {
  const uint32_t dp_states = 1u << (16 - bits), his = 1u << bits;
  if (bits <= 2) {  // runs of 2 or 4 equal values: a gather beats a loop that short
    for (uint32_t s = 0; s < (1u << 16); ++s) spread[s] = cost[s >> bits];
  } else {
    for (uint32_t p = 0; p < dp_states; ++p) {
      const float c = cost[p];
      float* __restrict out = spread + (static_cast<size_t>(p) << bits);
      for (uint32_t lo = 0; lo < his; ++lo) out[lo] = c;
    }
  }
  for (uint32_t e = 0; e < dp_states; ++e) {
    const float d = values[e] - w;
    next[e] = spread[e] + d * d;
    best_hi[e] = 0.0f;
  }
  for (uint32_t hi = 1; hi < his; ++hi) {
    const float* __restrict v = values + (static_cast<size_t>(hi) << (16 - bits));
    const float* __restrict sp = spread + (static_cast<size_t>(hi) << (16 - bits));
    const float h = static_cast<float>(hi);
    for (uint32_t e = 0; e < dp_states; ++e) {
      const float d = v[e] - w;
      const float c = sp[e] + d * d;
      const float old = next[e];
      const bool better = c < old;
      next[e] = better ? c : old;
      best_hi[e] = better ? h : best_hi[e];
    }
  }
  for (uint32_t e = 0; e < dp_states; ++e) back[e] = static_cast<uint8_t>(static_cast<int32_t>(best_hi[e]));
}

}  // namespace

double viterbi_path(const float* targets, int n, int bits, const float* values, int64_t edge, ViterbiWorkspace& ws,
                    uint32_t* states) {
  const uint32_t dp_states = 1u << (16 - bits);
  ws.cost.resize(dp_states);
  ws.next.resize(dp_states);
  ws.best_hi.resize(dp_states);
  ws.spread.resize(1u << 16);
  ws.back.resize(static_cast<size_t>(n) * dp_states);
  if (edge < 0) {
    std::fill(ws.cost.begin(), ws.cost.end(), 0.0f);
  } else {
    std::fill(ws.cost.begin(), ws.cost.end(), kUnreachable);
    ws.cost[static_cast<size_t>(edge)] = 0.0f;
  }
  for (int t = 0; t < n; ++t) {
    step(ws.cost.data(), targets[t], bits, values, ws.spread.data(), ws.next.data(), ws.best_hi.data(),
         ws.back.data() + static_cast<size_t>(t) * dp_states);
    ws.cost.swap(ws.next);
  }
  uint32_t e = edge >= 0 ? static_cast<uint32_t>(edge)
                         : static_cast<uint32_t>(std::min_element(ws.cost.begin(), ws.cost.end()) - ws.cost.begin());
  const double total = ws.cost[e];
  for (int t = n - 1; t >= 0; --t) {
    const uint32_t hi = ws.back[static_cast<size_t>(t) * dp_states + e];
    const uint32_t s = (hi << (16 - bits)) | e;
    states[t] = s;
    e = s >> bits;
  }
  return total;
}

double viterbi_tile(const float* targets, int bits, const float* values, ViterbiWorkspace& ws, uint8_t* symbols,
                    uint32_t* states) {
  constexpr int kHalf = kTileValues / 2;
  float rotated[kTileValues];
  uint32_t path[kTileValues];
  std::copy(targets + kHalf, targets + kTileValues, rotated);
  std::copy(targets, targets + kHalf, rotated + kHalf);
  viterbi_path(rotated, kTileValues, bits, values, -1, ws, path);
  const uint32_t edge = path[kTileValues - 1 - kHalf] & ((1u << (16 - bits)) - 1u);  // the state at position 255
  const double cost = viterbi_path(targets, kTileValues, bits, values, edge, ws, path);
  for (int t = 0; t < kTileValues; ++t) symbols[t] = static_cast<uint8_t>(path[t] & ((1u << bits) - 1u));
  if (states) std::copy(path, path + kTileValues, states);
  return cost;
}

}  // namespace kiln::exl3
