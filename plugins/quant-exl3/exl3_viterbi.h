// The trellis search of the EXL3 encoder (specs/exl3.md §6): for one tile's 256 targets in code order, the K-bit
// symbols whose tail-biting state sequence decodes closest to them in squared error.
//
// The 16-bit state of position t is (state_{t−1} << K | v_t) & 0xFFFF, so what position t passes on to t + 1 is the
// low 16 − K bits of its state: that is the DP state (2^(16−K) of them). A full state s = hi·2^(16−K) + e ends in DP
// state e = s mod 2^(16−K) and comes from DP state s >> K; each step is a sweep over all 65,536 full states, laid out
// so the inner loop runs over contiguous arrays without branches (min and argmin by select), which the compiler
// vectorises.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::exl3 {

// Scratch for one thread's searches (the backpointers are 256 × 2^(16−K) bytes: 8 MiB at K = 1).
struct ViterbiWorkspace {
  std::vector<float> cost, next, spread, best_hi;
  std::vector<uint8_t> back;
};

// The best path over targets[0..n) (n ≤ 256) with the codebook's decoded value of every 16-bit state in
// `values[65536]`. `edge` < 0: free start and end; otherwise the DP state entering position 0 and leaving
// position n − 1 are both `edge` (a closed, tail-biting path). Writes the n full states; returns the path's
// squared error.
double viterbi_path(const float* targets, int n, int bits, const float* values, int64_t edge, ViterbiWorkspace& ws,
                    uint32_t* states);

// The tail-biting search of a whole tile (two passes): the first runs from position 128 around to 127 with free
// ends, and the state it chooses at position 255 (mid-path, so settled) fixes the edge between 255 and 0; the
// second is the constrained pass from 0 to 255. Writes the 256 symbols (state_t & (2^K − 1)) and, if `states` is
// not null, the 256 states; returns the squared error. The symbols' stream decodes to exactly these states.
double viterbi_tile(const float* targets, int bits, const float* values, ViterbiWorkspace& ws, uint8_t* symbols,
                    uint32_t* states = nullptr);

}  // namespace kiln::exl3
