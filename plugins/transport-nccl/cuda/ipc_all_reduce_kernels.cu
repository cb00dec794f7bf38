#include <cuda_bf16.h>

#include "ipc_all_reduce_kernels.h"
#include "kiln/cuda/moe_combine_norm_row.cuh"

namespace kiln::nccl::cuda {
namespace {

enum BarrierKind { kStart = 0, kMid = 1, kEnd = 2 };

__device__ __forceinline__ int slot(int kind, int block, int rank) {
  return (kind * kMaxBlocks + block) * kMaxRanks + rank;
}
constexpr int kCounterWord = kBarrierKinds * kMaxBlocks * kMaxRanks;

// System scope: the peer may be another process, on this GPU or across NVLink/PCIe.
__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct Args {
  PeerTable peers;
  int rank, world;
  int64_t packs;
  uint4* out;
  uint64_t timeout_ns;  // 0: none
  uint32_t* timed_out;
};

// Block b of every rank meets here. The leading __syncthreads orders this block's earlier writes (the two-shot's
// reduced slice) before the release; the trailing one extends the acquiring threads' view to the whole block.
// False in every thread when a peer missed the deadline.
__device__ bool block_barrier(const Args& a, int kind, uint32_t epoch, uint64_t deadline_ns) {
  __shared__ int late;
  if (threadIdx.x == 0) late = 0;
  __syncthreads();
  if (threadIdx.x < a.world) {
    const int peer = threadIdx.x;
    store_release(a.peers.signal[peer] + slot(kind, blockIdx.x, a.rank), epoch);
    const uint32_t* mine = a.peers.signal[a.rank] + slot(kind, blockIdx.x, peer);
    uint32_t spins = 0;
    while (load_acquire(mine) != epoch) {
      if (deadline_ns != 0 && (++spins & 1023u) == 0 && global_ns() > deadline_ns) {
        late = 1;
        atomicExch(a.timed_out, 1u);
        break;
      }
    }
  }
  __syncthreads();
  return late == 0;
}

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Pack i summed over ranks 0..W−1 in that order, starting from rank 0's value (not from 0.0f, which would turn a
// lone −0.0 into +0.0), rounded once to T.
template <class T>
__device__ __forceinline__ uint4 sum_ranks(const Args& a, int64_t i) {
  constexpr int kN = kPackBytes / sizeof(T);
  uint4 v[kMaxRanks];
#pragma unroll
  for (int r = 0; r < kMaxRanks; ++r)
    if (r < a.world) v[r] = reinterpret_cast<const uint4*>(a.peers.data[r])[i];
  float acc[kN];
  const T* first = reinterpret_cast<const T*>(&v[0]);
#pragma unroll
  for (int k = 0; k < kN; ++k) acc[k] = to_float(first[k]);
#pragma unroll
  for (int r = 1; r < kMaxRanks; ++r) {
    if (r >= a.world) break;
    const T* e = reinterpret_cast<const T*>(&v[r]);
#pragma unroll
    for (int k = 0; k < kN; ++k) acc[k] += to_float(e[k]);
  }
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int k = 0; k < kN; ++k) o[k] = from_float<T>(acc[k]);
  return out;
}

template <class T, bool kTwoShot>
__global__ void __launch_bounds__(kThreadsPerBlock) ipc_all_reduce_kernel(Args a) {
  uint32_t* counter = a.peers.signal[a.rank] + kCounterWord + blockIdx.x;
  // Written by this block in the previous call, which finished before this kernel started.
  const uint32_t epoch = *counter + 1;
  const uint64_t deadline = a.timeout_ns != 0 ? global_ns() + a.timeout_ns : 0;
  if (!block_barrier(a, kStart, epoch, deadline)) return;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if constexpr (!kTwoShot) {
    for (int64_t i = first; i < a.packs; i += stride) a.out[i] = sum_ranks<T>(a, i);
  } else {
    // Slice q is reduced by rank q into its own staging buffer, where no other rank reads in this phase (rank p
    // reads slice p), and read by every rank after the mid barrier with the same block/thread mapping that
    // wrote it, so the per-block barrier is enough.
    const int64_t slice = (a.packs + a.world - 1) / a.world;
    auto begin = [&](int q) { return min(int64_t{q} * slice, a.packs); };
    auto end = [&](int q) { return min(int64_t{q + 1} * slice, a.packs); };
    uint4* mine = reinterpret_cast<uint4*>(a.peers.data[a.rank]);
    for (int64_t i = begin(a.rank) + first; i < end(a.rank); i += stride) mine[i] = sum_ranks<T>(a, i);
    if (!block_barrier(a, kMid, epoch, deadline)) return;
    for (int q = 0; q < a.world; ++q) {
      const uint4* reduced = reinterpret_cast<const uint4*>(a.peers.data[q]);
      for (int64_t i = begin(q) + first; i < end(q); i += stride) a.out[i] = reduced[i];
    }
  }
  // No rank may copy its next input over its staging buffer while a peer still reads it.
  if (!block_barrier(a, kEnd, epoch, deadline)) return;
  if (threadIdx.x == 0) *counter = epoch;
}

// The MoE sum fused with the combine, residual add and next RMSNorm (kiln::MoeCombineNorm). After the start barrier
// block b takes token b (IpcAllReduce takes up to kMaxBlocks tokens): it first pulls the token's rows — its top_k
// routed slots and its shared-expert row — from every rank's staging buffer in 16-byte packs, summed in rank order
// as the one-shot kernel sums them (sum_ranks), into shared memory: one round of remote loads, kPullBatch packs a
// thread in flight, rather than one per slot from inside the norm's loop (on two GPUs each is an NVLink round trip).
// Then the SDK's row body over the shared rows, which the core's combine kernel runs over the all-reduced rows: the
// same values in the same order, so the same bits.
constexpr int kPullBatch = 4;

template <int kPer>
__global__ void __launch_bounds__(kNormThreads) moe_combine_norm_kernel(Args a, MoeCombineNormArgs c) {
  extern __shared__ uint4 staged4[];  // [(top_k + shared) · hidden] fp32: routed slots, then the shared row
  const float* staged = reinterpret_cast<const float*>(staged4);
  uint32_t* counter = a.peers.signal[a.rank] + kCounterWord + blockIdx.x;
  const uint32_t epoch = *counter + 1;
  if (!block_barrier(a, kStart, epoch, 0)) return;
  const int64_t row_packs = c.hidden / 4, routed_packs = c.top_k * row_packs;
  const int64_t total = routed_packs + (c.shared ? row_packs : 0);
  for (int64_t t = blockIdx.x; t < c.n; t += gridDim.x) {
    auto source = [&](int64_t p) {  // pack p of the token's rows → its pack in the staging buffers
      return p < routed_packs ? t * routed_packs + p : (c.n * c.top_k + t) * row_packs + (p - routed_packs);
    };
    for (int64_t first = threadIdx.x; first < total; first += kPullBatch * kNormThreads) {
      uint4 v[kPullBatch];
#pragma unroll
      for (int u = 0; u < kPullBatch; ++u) {
        const int64_t p = first + static_cast<int64_t>(u) * kNormThreads;
        if (p < total) v[u] = sum_ranks<float>(a, source(p));
      }
#pragma unroll
      for (int u = 0; u < kPullBatch; ++u) {
        const int64_t p = first + static_cast<int64_t>(u) * kNormThreads;
        if (p < total) staged4[p] = v[u];
      }
    }
    __syncthreads();
    ::kiln::cuda::moe_combine_add_rmsnorm_row<kNormThreads, kPer>(
        [&](int64_t k, int64_t i) { return staged[k * c.hidden + i]; }, c.top_k,
        [&](float s, int64_t i) {
          if (c.shared) s += ::kiln::cuda::moe_shared_term(staged[c.top_k * c.hidden + i]);
          return s;
        },
        c.hidden, c.residual + t * c.hidden, c.norm_weight, c.eps, c.normed + t * c.hidden);
    __syncthreads();  // the shared rows, the row body's scale and reduction storage serve the next token
  }
  if (!block_barrier(a, kEnd, epoch, 0)) return;
  if (threadIdx.x == 0) *counter = epoch;
}

template <class T>
cudaError_t launch_typed(const Args& a, bool two_shot, int blocks, cudaStream_t stream) {
  if (two_shot)
    ipc_all_reduce_kernel<T, true><<<blocks, kThreadsPerBlock, 0, stream>>>(a);
  else
    ipc_all_reduce_kernel<T, false><<<blocks, kThreadsPerBlock, 0, stream>>>(a);
  return cudaGetLastError();
}

auto moe_combine_norm_kernel_for(int64_t hidden) {
  switch (::kiln::cuda::rmsnorm_row_values(hidden, kNormThreads)) {
    case 4: return moe_combine_norm_kernel<4>;
    case 8: return moe_combine_norm_kernel<8>;
    case 16: return moe_combine_norm_kernel<16>;
    case 32: return moe_combine_norm_kernel<32>;
    default: return moe_combine_norm_kernel<0>;
  }
}

}  // namespace

int ipc_all_reduce_blocks(int64_t packs) {
  const int64_t wanted = (packs + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(wanted < 1 ? 1 : (wanted > kMaxBlocks ? kMaxBlocks : wanted));
}

cudaError_t launch_ipc_all_reduce(const PeerTable& peers, int rank, int world, ElementType type, bool two_shot,
                                  int64_t packs, void* out, uint64_t timeout_ns, uint32_t* timed_out,
                                  cudaStream_t stream) {
  if (world < 1 || world > kMaxRanks || rank < 0 || rank >= world || packs < 0) return cudaErrorInvalidValue;
  if (packs == 0) return cudaSuccess;
  const Args a{peers, rank, world, packs, static_cast<uint4*>(out), timeout_ns, timed_out};
  const int blocks = ipc_all_reduce_blocks(packs);
  return type == ElementType::kF32 ? launch_typed<float>(a, two_shot, blocks, stream)
                                   : launch_typed<__nv_bfloat16>(a, two_shot, blocks, stream);
}

}  // namespace kiln::nccl::cuda

namespace kiln::nccl::cuda {

cudaError_t launch_ipc_moe_combine_norm(const PeerTable& peers, int rank, int world, const MoeCombineNormArgs& c,
                                        cudaStream_t stream) {
  if (world < 1 || world > kMaxRanks || rank < 0 || rank >= world || c.n < 0 || c.top_k < 1 || c.hidden < 1)
    return cudaErrorInvalidValue;
  if (c.n == 0) return cudaSuccess;
  if (c.hidden % 4 != 0 || moe_combine_norm_shared_bytes(c.top_k, c.hidden, c.shared) > kMoeCombineNormMaxSharedBytes)
    return cudaErrorInvalidValue;
  const Args a{peers, rank, world, 0, nullptr, 0, nullptr};
  const int blocks = static_cast<int>(c.n < kMaxBlocks ? c.n : kMaxBlocks);
  const auto kernel = moe_combine_norm_kernel_for(c.hidden);
  const size_t smem = moe_combine_norm_shared_bytes(c.top_k, c.hidden, c.shared);
  // Above 48 KiB a kernel must opt in; the attribute is a property of the function, not a stream operation, so
  // setting it is allowed while a graph is being captured.
  if (smem > (size_t{48} << 10)) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kMoeCombineNormMaxSharedBytes));
    if (e != cudaSuccess) return e;
  }
  kernel<<<blocks, kNormThreads, smem, stream>>>(a, c);
  return cudaGetLastError();
}

}  // namespace kiln::nccl::cuda
