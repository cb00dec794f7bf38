// The custom all-reduce kernels: every rank's staging buffer and signal area are mapped into every rank (CUDA IPC),
// and one kernel per call reduces them in rank order 0..W−1 with fp32 accumulation, so every rank computes the
// same bits. One-shot: each rank reads every rank's whole buffer. Two-shot: each rank reduces its 1/W slice into
// its own staging buffer (reduce-scatter), then copies every rank's reduced slice (all-gather).
// Ranks meet at per-block barriers on flags in the signal areas: block b of every rank writes the call's epoch into
// slot [b][its rank] of every rank's area (release, system scope) and spins on its own area's slots (acquire).
// The epoch lives in device memory (a counter per block), so a captured graph replays correctly.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kiln::nccl::cuda {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 32;
constexpr int kThreadsPerBlock = 512;
constexpr int kBarrierKinds = 3;  // start, mid (two-shot), end: separate slots so a fast rank never overwrites a
                                  // slot another rank still waits on
// One rank's signal area: flags[kind][block][rank], then the epoch counter of each block. Zeroed once.
constexpr size_t kSignalWords = size_t{kBarrierKinds} * kMaxBlocks * kMaxRanks + kMaxBlocks;
constexpr size_t kSignalBytes = 4096;
static_assert(kSignalWords * 4 <= kSignalBytes);
constexpr size_t kPackBytes = 16;  // one uint4 load: 4 fp32 or 8 bf16

enum class ElementType { kF32, kBF16 };

// Every rank's staging buffer and signal area as this process sees them (its own, and the peers' opened handles).
struct PeerTable {
  char* data[kMaxRanks];
  uint32_t* signal[kMaxRanks];
};

// Blocks a call of `packs` 16-byte packs runs on: the same on every rank, which the barriers need.
int ipc_all_reduce_blocks(int64_t packs);

// Reduces `packs` packs of the staging buffers into `out` (16-byte aligned, not a staging buffer). The caller has
// copied its input into its own staging buffer earlier on `stream`. timeout_ns > 0: a block that waits longer than
// that at a barrier gives up and sets *timed_out (the probe's guard against peers whose writes never arrive);
// 0: wait as long as it takes.
cudaError_t launch_ipc_all_reduce(const PeerTable& peers, int rank, int world, ElementType type, bool two_shot,
                                  int64_t packs, void* out, uint64_t timeout_ns, uint32_t* timed_out,
                                  cudaStream_t stream);

// The fused MoE sum + combine + residual add + RMSNorm (kiln::MoeCombineNorm): the caller has copied its fp32 rows
// ((n·top_k + (shared ? n : 0)) · hidden values) into its own staging buffer earlier on `stream`. One block of
// kNormThreads per token, at most kMaxBlocks blocks (each then takes every kMaxBlocks-th token; IpcAllReduce takes
// steps of up to kMaxBlocks tokens).
constexpr int kNormThreads = 256;
struct MoeCombineNormArgs {
  int64_t n, top_k, hidden;
  bool shared;
  float* residual;
  const uint16_t* norm_weight;
  float eps;
  uint16_t* normed;
};
// The block's shared memory: the token's rows summed over the ranks. Calls needing more than the cap (e.g. 8 slots +
// a shared expert of 7168 values: 258 KB) are not fused; hidden must be a multiple of 4 (16-byte packs).
constexpr size_t kMoeCombineNormMaxSharedBytes = size_t{160} << 10;
inline size_t moe_combine_norm_shared_bytes(int64_t top_k, int64_t hidden, bool shared) {
  return static_cast<size_t>((top_k + (shared ? 1 : 0)) * hidden) * sizeof(float);
}
cudaError_t launch_ipc_moe_combine_norm(const PeerTable& peers, int rank, int world, const MoeCombineNormArgs& c,
                                        cudaStream_t stream);

}  // namespace kiln::nccl::cuda
