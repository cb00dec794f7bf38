#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "exl3_codebook_device.cuh"
#include "exl3_viterbi_cuda.h"

namespace kiln::exl3::cuda {
namespace {

constexpr int kValues = 256;               // targets per tile
constexpr int kThreads = 1024;
constexpr float kUnreachable = 1e30f;      // exl3_viterbi.cpp's
constexpr size_t kBackBudget = size_t(1) << 30;  // backpointer bytes per launch

// The cost of reaching full state s (DP state s mod 2^(16−K), from s >> K) with target w, rounded as the CPU rounds
// it. CB ≥ 0 decodes the state's value in registers (the table's value bit for bit, exl3_codebook_device.cuh) instead
// of reading the 256 KiB table from L2 at every step.
template <int CB>
__device__ __forceinline__ float arrive(const float* cost, const float* __restrict__ values, uint32_t s, int bits,
                                        float w) {
  const float v = CB < 0 ? __ldg(values + s) : decode_state(s, CB);
  const float d = __fsub_rn(v, w);
  return __fadd_rn(cost[s >> bits], __fmul_rn(d, d));
}

// One pass of viterbi_path over t[0..256): `edge` < 0 free ends, else closed at that DP state. Leaves the path's
// full states in `path` and returns its cost (valid in every thread).
template <int CB>
__device__ float pass(const float* t, int bits, const float* __restrict__ values, int64_t edge, float* cost,
                      float* next, uint8_t* back, uint32_t* path, float* red_v, uint32_t* red_i) {
  const uint32_t dp = 1u << (16 - bits), his = 1u << bits;
  for (uint32_t e = threadIdx.x; e < dp; e += blockDim.x)
    cost[e] = edge < 0 ? 0.0f : (e == static_cast<uint32_t>(edge) ? 0.0f : kUnreachable);
  __syncthreads();
  for (int step = 0; step < kValues; ++step) {
    const float w = t[step];
    uint8_t* b = back + static_cast<size_t>(step) * dp;
    for (uint32_t e = threadIdx.x; e < dp; e += blockDim.x) {
      float best = arrive<CB>(cost, values, e, bits, w);
      uint32_t best_hi = 0;
      for (uint32_t hi = 1; hi < his; ++hi) {
        const float c = arrive<CB>(cost, values, (hi << (16 - bits)) | e, bits, w);
        if (c < best) best = c, best_hi = hi;
      }
      next[e] = best;
      b[e] = static_cast<uint8_t>(best_hi);
    }
    __syncthreads();
    float* swap = cost;
    cost = next;
    next = swap;
  }
  // The end state: the closing edge, or the first state of least cost (std::min_element).
  uint32_t end = 0;
  if (edge >= 0) {
    end = static_cast<uint32_t>(edge);
  } else {
    float v = kUnreachable * 2;
    uint32_t i = 0xFFFFFFFFu;
    for (uint32_t e = threadIdx.x; e < dp; e += blockDim.x)
      if (cost[e] < v) v = cost[e], i = e;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_down_sync(0xFFFFFFFFu, v, off);
      const uint32_t oi = __shfl_down_sync(0xFFFFFFFFu, i, off);
      if (ov < v || (ov == v && oi < i)) v = ov, i = oi;
    }
    if (threadIdx.x % 32 == 0) red_v[threadIdx.x / 32] = v, red_i[threadIdx.x / 32] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
        if (red_v[w] < red_v[0] || (red_v[w] == red_v[0] && red_i[w] < red_i[0])) red_v[0] = red_v[w], red_i[0] = red_i[w];
    }
    __syncthreads();
    end = red_i[0];
  }
  const float total = cost[end];
  if (threadIdx.x == 0) {  // the backpointers of every step are written and visible (barriers above)
    uint32_t e = end;
    for (int step = kValues - 1; step >= 0; --step) {
      const uint32_t hi = back[static_cast<size_t>(step) * dp + e];
      const uint32_t s = (hi << (16 - bits)) | e;
      path[step] = s;
      e = s >> bits;
    }
  }
  __syncthreads();
  return total;
}

// Block b searches tile first + b: the free-ended pass from position 128 around to 127 picks the state at 255,
// which closes the second pass over 0..255 (viterbi_tile).
template <int CB>
__global__ void __launch_bounds__(kThreads) viterbi_tiles_kernel(const float* __restrict__ targets, int bits,
                                                                  const float* __restrict__ values, uint8_t* backs,
                                                                  uint8_t* symbols, float* errors) {
  extern __shared__ float s_cost[];  // [2][dp]
  __shared__ float s_t[kValues];
  __shared__ uint32_t s_path[kValues];
  __shared__ float red_v[kThreads / 32];
  __shared__ uint32_t red_i[kThreads / 32];
  const uint32_t dp = 1u << (16 - bits);
  const float* t = targets + static_cast<size_t>(blockIdx.x) * kValues;
  uint8_t* back = backs + static_cast<size_t>(blockIdx.x) * kValues * dp;
  for (int i = threadIdx.x; i < kValues; i += blockDim.x) s_t[i] = t[(i + kValues / 2) % kValues];
  __syncthreads();
  pass<CB>(s_t, bits, values, -1, s_cost, s_cost + dp, back, s_path, red_v, red_i);
  const uint32_t edge = s_path[kValues - 1 - kValues / 2] & (dp - 1);
  for (int i = threadIdx.x; i < kValues; i += blockDim.x) s_t[i] = t[i];
  __syncthreads();
  const float total = pass<CB>(s_t, bits, values, edge, s_cost, s_cost + dp, back, s_path, red_v, red_i);
  for (int i = threadIdx.x; i < kValues; i += blockDim.x)
    symbols[static_cast<size_t>(blockIdx.x) * kValues + i] = static_cast<uint8_t>(s_path[i] & ((1u << bits) - 1u));
  if (threadIdx.x == 0) errors[blockIdx.x] = total;
}

std::string failed(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

}  // namespace

bool viterbi_device_usable() {
  const char* force = std::getenv("KILN_EXL3_VITERBI");
  if (force && std::strcmp(force, "cpu") == 0) return false;
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string viterbi_tiles(const float* targets, int64_t tiles, int bits, const float* values, uint8_t* symbols,
                          double* errors, int codebook) {
  if (bits < 2 || bits > 8) return "the device Viterbi takes 2..8 bits, got " + std::to_string(bits);
  if (codebook < -1 || codebook > kCbMul1) return "the device Viterbi: unknown codebook " + std::to_string(codebook);
  auto kernel = codebook == kCb3Inst ? viterbi_tiles_kernel<kCb3Inst>
                : codebook == kCbMcg ? viterbi_tiles_kernel<kCbMcg>
                : codebook == kCbMul1 ? viterbi_tiles_kernel<kCbMul1>
                                      : viterbi_tiles_kernel<-1>;
  if (tiles <= 0) return "";
  const uint32_t dp = 1u << (16 - bits);
  const size_t smem = size_t(2) * dp * sizeof(float);
  const size_t back_per_tile = size_t(kValues) * dp;
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(tiles, kBackBudget / back_per_tile));
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return failed("exl3 Viterbi: shared memory", e);
  float *d_values = nullptr, *d_targets = nullptr, *d_errors = nullptr;
  uint8_t *d_backs = nullptr, *d_symbols = nullptr;
  std::string err;
  auto check = [&](cudaError_t r, const char* what) {
    if (r != cudaSuccess && err.empty()) err = failed(what, r);
    return err.empty();
  };
  if (check(cudaMalloc(&d_values, sizeof(float) << 16), "exl3 Viterbi: allocation") &&
      check(cudaMalloc(&d_targets, sizeof(float) * kValues * batch), "exl3 Viterbi: allocation") &&
      check(cudaMalloc(&d_errors, sizeof(float) * batch), "exl3 Viterbi: allocation") &&
      check(cudaMalloc(&d_symbols, size_t(kValues) * batch), "exl3 Viterbi: allocation") &&
      check(cudaMalloc(&d_backs, back_per_tile * batch), "exl3 Viterbi: allocation") &&
      check(cudaMemcpy(d_values, values, sizeof(float) << 16, cudaMemcpyHostToDevice), "exl3 Viterbi: upload")) {
    std::vector<float> errs(static_cast<size_t>(batch));
    for (int64_t first = 0; first < tiles && err.empty(); first += batch) {
      const int64_t n = std::min(batch, tiles - first);
      if (!check(cudaMemcpy(d_targets, targets + first * kValues, sizeof(float) * kValues * n, cudaMemcpyHostToDevice),
                 "exl3 Viterbi: upload"))
        break;
      kernel<<<static_cast<unsigned>(n), kThreads, smem>>>(d_targets, bits, d_values, d_backs, d_symbols, d_errors);
      if (!check(cudaGetLastError(), "exl3 Viterbi: launch") ||
          !check(cudaMemcpy(symbols + first * kValues, d_symbols, size_t(kValues) * n, cudaMemcpyDeviceToHost),
                 "exl3 Viterbi") ||
          !check(cudaMemcpy(errs.data(), d_errors, sizeof(float) * n, cudaMemcpyDeviceToHost), "exl3 Viterbi"))
        break;
      if (errors)
        for (int64_t i = 0; i < n; ++i) errors[first + i] = errs[static_cast<size_t>(i)];
    }
  }
  cudaFree(d_values);
  cudaFree(d_targets);
  cudaFree(d_errors);
  cudaFree(d_symbols);
  cudaFree(d_backs);
  return err;
}

}  // namespace kiln::exl3::cuda
