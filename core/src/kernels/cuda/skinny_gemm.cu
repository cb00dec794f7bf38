#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/skinny_gemm.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxWarps = 16;
// k is cut into kKSlices interleaved slices whatever the block's warp count: slice s holds the 32-wide chunks
// s, s + 16, s + 32, ... and sums them in that order; a block adds (slice w + slice w + 8) for w = 0..7, in w
// order. A 16-warp block runs one slice per warp, an 8-warp block two (w and w + 8, in two accumulators), so an
// output's bits depend on `in` alone — not on how many tiles the call has, which picks the warp count. That is
// what makes a column-sharded linear (tensor parallelism: a rank computes some of the rows) bitwise equal to the
// same rows of the whole one.
constexpr int kKSlices = 16;

// 16 bytes of x, which the previous kernel may have written: an ordinary load, kept after pdl_wait() by being
// volatile.
__device__ __forceinline__ uint4 load_activation(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// A block owns kM·16 output rows and all n rows of x; its kWarps warps split k into 32-wide chunks (warp w takes
// chunks w, w + kWarps, ..., chunk ch summed into the accumulator of slice ch % kKSlices, see kKSlices). Lane (g = lane / 4, c = lane % 4) loads 8 consecutive k of W rows g and g + 8 and
// of x row g; the mma's k order is a permutation of those (logical k {2c, 2c+1, 2c+8, 2c+9} of the first mma =
// physical 8c..8c+3, of the second = 8c+4..8c+7), the same for both operands, so the sums are the plain dot
// products. Per-warp partials meet in shared memory in the fixed slice order. A round loads kUnroll chunks per warp
// into registers before any is used; kUnroll only sets how many bytes are in flight, not the order in which a
// slice's chunks are summed.
// Programmatic dependent launch (pdl.cuh): the first round of W loads is issued before pdl_wait() (in the SASS
// too: see the prologue), so the launch and the first DRAM round trip overlap the previous kernel; x (and y when
// accumulating) is read after it.
// Blocks of kMaxWarps warps only where launch_rows may pick that many (kM == 1, kNT ≤ 4), else 8.
// Batch b = blockIdx.y offsets x, W and y by its strides (SkinnyStrides).
// kSwiGlu (kM == 2): W is a fused [2·out, in] gate|up weight; the block's tile 0 is gate rows row0.., its tile 1
// the up rows out + row0.. (each k-reduced exactly as a plain tile), and the epilogue writes
// y = bf16(silu(min(gate, limit)) · clamp(up, ±limit)) over [n, out] from the bf16-rounded gate and up, as
// swiglu_bf16 does after a bf16 gate_up GEMM.
// One block per SM is all __launch_bounds__ promises: asked for more, ptxas squeezes the registers by issuing
// each x load just before its mma pair (four dependent L2 round trips a round) instead of all at once. The one
// exception: the one-row, one-tile 8-warp form (q_b, un-absorption at c1) fits three blocks per SM at 80 registers
// without that, as it did before its second accumulator (88 unbounded: two blocks; H200, GLM-4.7-Flash c1 decode
// 227.2 / 194.4 / 146.4 tok/s at 4K / 32K / 128K unbounded, 230.0 / 198.8 / 149.8 bounded, bench/RESULTS.md).
template <int kM, int kNT, int kUnroll, int kWarps, bool kSwiGlu = false>
__global__ void __launch_bounds__(kWarps * 32, kM == 1 && kNT == 1 && kUnroll == 4 && kWarps == 8 ? 3 : 1)
    skinny_gemm_kernel(const uint16_t* x, int n, int in, const uint16_t* __restrict__ w, int out, void* y,
                       SkinnyStrides st, bool y_f32, bool accumulate, float limit) {
  static_assert(!kSwiGlu || kM == 2, "a SwiGLU block owns one gate tile and the matching up tile");
  static_assert(kWarps == 8 || kWarps == 16, "a warp holds one or two of the 16 k slices");
  constexpr int kSlicesPerWarp = kKSlices / kWarps;
  // A round spans kUnroll · kWarps chunks, a multiple of kKSlices, so chunk u of every round is in the same slice.
  static_assert(kUnroll % kSlicesPerWarp == 0);
  extern __shared__ float s_part[];  // [kWarps][kM][kNT][4][32]: each warp's slices already added (w + (w + 8))
  const int64_t batch = blockIdx.y;
  x += batch * st.x_batch;
  w += batch * st.w_batch;
  constexpr int warps = kWarps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  constexpr int kRows = kSwiGlu ? 16 : kM * 16;  // output rows a block owns
  const int row0 = blockIdx.x * kRows;
  const int chunks = (in + 31) / 32;

  const uint16_t* w_row[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // rows past `out` re-read the last row; their results are dropped
      const int64_t r = kSwiGlu ? static_cast<int64_t>(mt) * out + min(row0 + g + 8 * h, out - 1)
                                : min(row0 + mt * 16 + g + 8 * h, out - 1);
      w_row[mt][h] = w + r * in + 8 * c;
    }
  const uint16_t* x_row[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) x_row[nt] = x + static_cast<int64_t>(min(nt * 8 + g, n - 1)) * st.x_row + 8 * c;

  // One round: chunks base, base + warps, ... (kUnroll of them) of this warp's W rows into registers.
  uint4 wv[kUnroll][kM][2];
  bool valid[kUnroll];
  auto load_round = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = (base + u * warps) * 32;
      valid[u] = k + 8 * c < in;  // in % 8 == 0: a lane's 8 values are all inside or all outside
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][mt][h] = valid[u] ? load_stream(w_row[mt][h] + k) : make_uint4(0, 0, 0, 0);
    }
  };

  // Prologue, weights only (pdl.cuh's contract), while the previous kernel may still be running. The branch also
  // keeps these loads ahead of the wait in the SASS: in one basic block ptxas issues griddepcontrol.wait first
  // (an acquire lets earlier loads sink below it), and the first round trip would start after the previous
  // kernel again.
  if (warp < chunks) {
    load_round(warp);
  } else {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) valid[u] = false;  // no chunk for this warp: the loop below never runs
  }
  pdl_wait();
  pdl_launch_dependents();

  float acc[kSlicesPerWarp][kM][kNT][4] = {};
  for (int base = warp; base < chunks; base += kUnroll * warps) {
    if (base != warp) load_round(base);
    // x of kXGroup chunks is loaded before their mmas, so those loads (L2 round trips after the wait, on the
    // critical path of every call) are in flight together rather than one per mma pair; 16 registers whatever kNT.
    // Each accumulator still takes its chunks in order u = 0, 1, ... (the sums are unchanged).
    constexpr int kXGroup = kNT == 1 ? 4 : kNT == 2 ? 2 : 1;
    static_assert(kUnroll % kXGroup == 0);
#pragma unroll
    for (int u0 = 0; u0 < kUnroll; u0 += kXGroup) {
      uint4 xv[kXGroup][kNT];
#pragma unroll
      for (int du = 0; du < kXGroup; ++du) {
        const int k = (base + (u0 + du) * warps) * 32;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          xv[du][nt] = valid[u0 + du] ? load_activation(x_row[nt] + k) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int du = 0; du < kXGroup; ++du)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int mt = 0; mt < kM; ++mt) {
            const uint4 a = wv[u0 + du][mt][0], b = wv[u0 + du][mt][1], xb = xv[du][nt];
            float(&d)[4] = acc[(u0 + du) % kSlicesPerWarp][mt][nt];
            mma_bf16_16816(d, a.x, b.x, a.y, b.y, xb.x, xb.y);
            mma_bf16_16816(d, a.z, b.z, a.w, b.w, xb.z, xb.w);
          }
    }
  }

  constexpr int kPerWarp = kM * kNT * 4 * 32;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float v = acc[0][mt][nt][r];
        if constexpr (kSlicesPerWarp == 2) v += acc[1][mt][nt][r];  // slice w + slice w + 8
        s_part[warp * kPerWarp + ((mt * kNT + nt) * 4 + r) * 32 + lane] = v;
      }
  __syncthreads();
  // Slice pair w's sum (slice w + slice w + 8) from the partials at `idx`: in the warp's own, or two warps' added.
  auto pair_sum = [&](int w, int idx) {
    if constexpr (kSlicesPerWarp == 2)
      return s_part[w * kPerWarp + idx];
    else
      return s_part[w * kPerWarp + idx] + s_part[(w + 8) * kPerWarp + idx];
  };
  // Element (row rr of the block, token j): consecutive threads take consecutive rows, so y stores coalesce.
  if constexpr (kSwiGlu) {
    for (int e = threadIdx.x; e < kRows * kNT * 8; e += blockDim.x) {
      const int rr = e % kRows, j = e / kRows;
      const int row = row0 + rr;
      if (row >= out || j >= n) continue;
      const int gg = rr % 8, half = rr / 8;
      const int nt = j / 8, cc = (j % 8) / 2, sub = j % 2;
      const int gate_idx = ((0 * kNT + nt) * 4 + half * 2 + sub) * 32 + gg * 4 + cc;
      const int up_idx = ((1 * kNT + nt) * 4 + half * 2 + sub) * 32 + gg * 4 + cc;
      float sg = 0.f, su = 0.f;
      for (int wi = 0; wi < kKSlices / 2; ++wi) {
        sg += pair_sum(wi, gate_idx);
        su += pair_sum(wi, up_idx);
      }
      const float gv = fminf(bf16_bits_to_float(float_to_bf16_bits(sg)), limit);
      const float uv = fminf(fmaxf(bf16_bits_to_float(float_to_bf16_bits(su)), -limit), limit);
      static_cast<uint16_t*>(y)[static_cast<int64_t>(j) * st.y_row + row] =
          float_to_bf16_bits(gv / (1.0f + expf(-gv)) * uv);
    }
    return;
  }
  for (int e = threadIdx.x; e < kRows * kNT * 8; e += blockDim.x) {
    const int rr = e % kRows, j = e / kRows;
    const int row = row0 + rr;
    if (row >= out || j >= n) continue;
    const int mt = rr / 16, gg = rr % 8, half = (rr % 16) / 8;
    const int nt = j / 8, cc = (j % 8) / 2, sub = j % 2;
    const int idx = ((mt * kNT + nt) * 4 + half * 2 + sub) * 32 + gg * 4 + cc;
    float s = 0.f;
    for (int wi = 0; wi < kKSlices / 2; ++wi) s += pair_sum(wi, idx);
    const int64_t o = batch * st.y_batch + static_cast<int64_t>(j) * st.y_row + row;
    if (y_f32) {
      float* yf = static_cast<float*>(y);
      yf[o] = accumulate ? yf[o] + s : s;
    } else {
      uint16_t* yb = static_cast<uint16_t*>(y);
      yb[o] = float_to_bf16_bits(accumulate ? bf16_bits_to_float(yb[o]) + s : s);
    }
  }
}

template <int kM, int kNT, int kUnroll, int kWarps>
Status launch(const uint16_t* x, int n, int in, const uint16_t* w, int out, void* y, const SkinnyStrides& st,
              bool y_f32, bool accumulate, StreamHandle stream) {
  const dim3 grid(static_cast<unsigned>((out + kM * 16 - 1) / (kM * 16)), static_cast<unsigned>(st.batches));
  const size_t smem = sizeof(float) * kWarps * kM * kNT * 4 * 32;
  return check_cuda(launch_pdl(skinny_gemm_kernel<kM, kNT, kUnroll, kWarps>, grid, dim3(kWarps * 32), smem, stream,
                               x, n, in, w, out, y, st, y_f32, accumulate, 0.f),
                    "cuda::skinny_gemm_bf16");
}

template <int kM, int kNT, int kUnroll>
Status launch(const uint16_t* x, int n, int in, const uint16_t* w, int out, void* y, const SkinnyStrides& st,
              bool y_f32, bool accumulate, int warps, StreamHandle stream) {
  if constexpr (kM == 1 && kNT <= 4)
    if (warps == kMaxWarps) return launch<kM, kNT, kUnroll, kMaxWarps>(x, n, in, w, out, y, st, y_f32, accumulate, stream);
  return launch<kM, kNT, kUnroll, 8>(x, n, in, w, out, y, st, y_f32, accumulate, stream);
}

// Whether a warp should keep 8 chunks (16 KB per 16-row tile pair, 8 KB per tile) in flight rather than 4: only
// where 4 would leave k for more than one round (o_proj's 5120, the shared expert's gate_up), since the deeper
// round doubles the block's registers (all of an SM's at 16 warps), which keeps the next kernel's blocks from
// starting their prologue beside it. Up to 16 rows only (32 would spill).
bool deep_rounds(int in, int warps) { return (in + 31) / 32 > 4 * warps; }

// The SwiGLU form: one block per 16 act columns (a gate tile and its up tile), always 8 warps, so the block
// shape depends on nothing but `inter` and a row's results on nothing but its own x row (batch invariance).
// Each output's k split is the fixed one of every tile (kKSlices), so act is bitwise what linear + swiglu_bf16 give.
constexpr int kSwiGluWarps = 8;

template <int kNT>
Status launch_swiglu(const uint16_t* x, int n, int in, const uint16_t* w, int inter, uint16_t* act, float limit,
                     StreamHandle stream) {
  SkinnyStrides st;
  st.x_row = in, st.y_row = inter;
  const dim3 grid(static_cast<unsigned>((inter + 15) / 16));
  const size_t smem = sizeof(float) * kSwiGluWarps * 2 * kNT * 4 * 32;
  auto kernel = skinny_gemm_kernel<2, kNT, 4, kSwiGluWarps, true>;
  if constexpr (kNT <= 2)
    if (deep_rounds(in, kSwiGluWarps)) kernel = skinny_gemm_kernel<2, kNT, 8, kSwiGluWarps, true>;
  return check_cuda(launch_pdl(kernel, grid, dim3(kSwiGluWarps * 32), smem, stream, x, n, in, w, inter,
                               static_cast<void*>(act), st, false, false, limit),
                    "cuda::skinny_gemm_swiglu_bf16");
}

// The block shape for n ≤ kSkinnyGemmMaxRows (kNT ≤ 4): a function of the output tiles (out and batches) and
// the SM count only. Whatever the shape, every output's k split and the order its slices meet in are the fixed
// ones of kKSlices, so an output depends on its W row and x row alone: not on the other rows of x (the token tiles
// only change which mma column a row occupies, and an mma column's sums do not depend on the other columns: batch
// invariance), nor on the other rows of W (a column-sharded part of W gives the same bits). Two 16-row tiles per block
// share each x load once there are blocks enough to fill the chip twice over; small matrices get one tile and,
// below one block per SM, 16 warps so more loads are in flight (deep_rounds: up to 128 KB per SM, what
// two-tile blocks reach at two blocks per SM). (Partials stay ≤ 32 KB of shared memory: warps · kM · kNT ≤ 64.)
struct BlockShape {
  bool two_tiles;
  int warps;
};
BlockShape block_shape(int64_t tiles, int sm_count) {
  if (tiles >= 4LL * sm_count) return {true, 8};
  return {false, tiles < sm_count ? kMaxWarps : 8};
}

template <int kNT>
Status launch_rows(const uint16_t* x, int n, int in, const uint16_t* w, int out, void* y, const SkinnyStrides& st,
                   bool y_f32, bool accumulate, int sm_count, StreamHandle stream) {
  const BlockShape shape = block_shape((out + 15) / 16 * st.batches, sm_count);
  if constexpr (kNT <= 4) {
    if (shape.two_tiles) return launch<2, kNT, 4>(x, n, in, w, out, y, st, y_f32, accumulate, shape.warps, stream);
    if constexpr (kNT <= 2)
      if (deep_rounds(in, shape.warps))
        return launch<1, kNT, 8>(x, n, in, w, out, y, st, y_f32, accumulate, shape.warps, stream);
    return launch<1, kNT, 4>(x, n, in, w, out, y, st, y_f32, accumulate, shape.warps, stream);
  } else {
    // 33..64 rows: one tile of 8 warps (the partials' shared-memory bound); the same k split as above.
    return launch<1, kNT, 4>(x, n, in, w, out, y, st, y_f32, accumulate, 8, stream);
  }
}

}  // namespace

bool skinny_gemm_supported(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w) {
  return n >= 1 && n <= kSkinnyGemmLimit && in > 0 && in % 8 == 0 && in <= INT32_MAX &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

Status skinny_gemm_bf16(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, void* y,
                        DType y_dtype, bool accumulate, int sm_count, StreamHandle stream) {
  SkinnyStrides st;
  st.x_row = in, st.y_row = out;
  return skinny_gemm_strided_batched_bf16(x, n, in, w, out, y, y_dtype, st, accumulate, sm_count, stream);
}

Status skinny_gemm_strided_batched_bf16(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t out,
                                        void* y, DType y_dtype, const SkinnyStrides& st, bool accumulate,
                                        int sm_count, StreamHandle stream) {
  if (y_dtype != DType::kBF16 && y_dtype != DType::kF32)
    return invalid_argument("cuda::skinny_gemm_bf16: y must be bf16 or fp32");
  if (!skinny_gemm_supported(x, n, in, w) || out <= 0 || out > INT32_MAX)
    return invalid_argument("cuda::skinny_gemm_bf16: need 1 ≤ n ≤ 64, in % 8 == 0, x and W 16-byte aligned");
  if (st.batches < 1 || st.batches > 65535 || st.x_row < in || st.x_row % 8 != 0 || st.x_batch % 8 != 0 ||
      st.w_batch % 8 != 0 || st.y_row < out)
    return invalid_argument(
        "cuda::skinny_gemm_bf16: need 1 ≤ batches ≤ 65535, x_row ≥ in, y_row ≥ out, x_row / x_batch / w_batch "
        "multiples of 8 (16-byte loads)");
  const bool f32 = y_dtype == DType::kF32;
  const int ni = static_cast<int>(n), ii = static_cast<int>(in), oi = static_cast<int>(out);
  const int sms = std::max(sm_count, 1);
  if (n <= 8) return launch_rows<1>(x, ni, ii, w, oi, y, st, f32, accumulate, sms, stream);
  if (n <= 16) return launch_rows<2>(x, ni, ii, w, oi, y, st, f32, accumulate, sms, stream);
  if (n <= 32) return launch_rows<4>(x, ni, ii, w, oi, y, st, f32, accumulate, sms, stream);
  return launch_rows<8>(x, ni, ii, w, oi, y, st, f32, accumulate, sms, stream);
}

Status skinny_gemm_swiglu_bf16(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t inter,
                               uint16_t* act, StreamHandle stream, float limit) {
  if (!skinny_gemm_supported(x, n, in, w) || n > kSkinnyGemmMaxRows || inter <= 0 || 2 * inter > INT32_MAX)
    return invalid_argument(
        "cuda::skinny_gemm_swiglu_bf16: need 1 ≤ n ≤ 32, in % 8 == 0, x and W 16-byte aligned, 0 < inter");
  const int ni = static_cast<int>(n), ii = static_cast<int>(in), wi = static_cast<int>(inter);
  if (n <= 8) return launch_swiglu<1>(x, ni, ii, w, wi, act, limit, stream);
  if (n <= 16) return launch_swiglu<2>(x, ni, ii, w, wi, act, limit, stream);
  return launch_swiglu<4>(x, ni, ii, w, wi, act, limit, stream);
}

}  // namespace kiln::cuda
