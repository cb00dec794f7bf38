#include "kernels/cuda/launch_check.cuh"
#include "runtime/cuda/mla_latent_gather.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 16;

// grid: (position blocks, sequences). kVec values per copy: 8 (16 bytes) when rows allow it, else 1.
template <int kVec>
__global__ void gather_kernel(MlaLatentGather g) {
  const KvGatherSeq seq = g.seqs[blockIdx.y];
  const int32_t* table = g.block_tables + static_cast<int64_t>(seq.table_row) * g.max_blocks;
  const int64_t units = g.row_width / kVec;
  const int64_t pos0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  for (int64_t i = threadIdx.x; i < kRowsPerBlock * units; i += kThreads) {
    const int64_t pos = pos0 + i / units, u = i % units;
    if (pos >= seq.kv_len) break;  // positions only grow with i
    const int64_t slot = static_cast<int64_t>(table[pos / g.block_size]) * g.block_size + pos % g.block_size;
    const uint16_t* src = g.pages + slot * g.row_width + u * kVec;
    uint16_t* dst = g.out + (seq.key_start + pos) * g.row_width + u * kVec;
    if constexpr (kVec == 8)
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    else
      *dst = *src;
  }
}

}  // namespace

Status mla_gather_latent_rows(const MlaLatentGather& g, StreamHandle stream) {
  if (g.num_seqs == 0 || g.max_kv_len <= 0) return ok_status();
  if (g.row_width <= 0 || g.block_size <= 0 || g.num_seqs > 65535)
    return invalid_argument("cuda::mla_gather_latent_rows: need row_width > 0, block_size > 0, ≤ 65535 sequences");
  const dim3 grid(blocks_for(g.max_kv_len, kRowsPerBlock), static_cast<unsigned>(g.num_seqs));
  const bool vec = g.row_width % 8 == 0 && reinterpret_cast<uintptr_t>(g.pages) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(g.out) % 16 == 0;
  if (vec)
    gather_kernel<8><<<grid, kThreads, 0, stream>>>(g);
  else
    gather_kernel<1><<<grid, kThreads, 0, stream>>>(g);
  return check_launch("cuda::mla_gather_latent_rows");
}

}  // namespace kiln::cuda
