// The EXL3 encoder's trellis search on a CUDA device (specs/exl3.md §6): the same tail-biting two-pass Viterbi as
// exl3_viterbi.h's viterbi_tile, one thread block per tile, many tiles per launch. Each DP state's cost, the order
// its 2^K predecessors are tried in (ascending, strictly smaller wins) and the end-state choice (the first smallest)
// are the CPU sweep's, and both sides round every product and sum on its own (no fused multiply-add: the CPU file
// is built with -ffp-contract=off), so the symbols and errors equal the CPU's bit for bit — `kiln quantize` writes
// the same bytes with or without a GPU. Host-side API in plain C++ (no CUDA types).
#pragma once

#include <cstdint>
#include <string>

namespace kiln::exl3::cuda {

// Whether a CUDA device is visible and KILN_EXL3_VITERBI does not say "cpu".
bool viterbi_device_usable();

// Searches `tiles` tiles: targets [tiles, 256] (host, code order), the codebook's decoded values of all 65,536
// states (host); writes symbols [tiles, 256] and, if not null, errors [tiles] (host). K = bits must be 2..8 (K = 1
// keeps 2 × 32,768 DP costs, more shared memory than a block gets: the caller searches those on the CPU).
// `codebook` (exl3::Codebook as int) decodes each state's value in registers — the same values as the table, without
// streaming it from L2 at every step; −1 reads `values`. Returns "" or what failed.
std::string viterbi_tiles(const float* targets, int64_t tiles, int bits, const float* values, uint8_t* symbols,
                          double* errors, int codebook = -1);

}  // namespace kiln::exl3::cuda
