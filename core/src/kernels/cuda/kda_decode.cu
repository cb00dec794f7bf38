// KDA recurrent step on the GPU: decode / verification (fused conv, gate, normalisation, delta rule and
// RMSNormGated), and the exact token-by-token fallback of kda_prefill.
//
// One CTA of 512 threads per (head, sequence). Warp w holds state rows w, w + 16, …, w + 112 (8 rows) and lane l
// columns 4l .. 4l + 3 of each: 32 fp32 registers, every row read and written as one 512-byte warp access. Per
// token: S ← diag(e^g) S; p = Sᵀk and a = Sᵀq in the same pass (row partial sums, then the 16 warps' partials
// summed in shared memory in warp order); u = β(v − p); S += k uᵀ; o = Sᵀq = a + u (k·q).
#include "kernels/cuda/kda.h"
#include "kernels/cuda/kda_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

using namespace kda_detail;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kD / kWarps;  // 8

struct RecurrentArgs {
  const uint16_t* qkv;  // bf16 rows of 3 · heads · 128 (pre-conv with kConv, else post-conv)
  const float* conv_weight;
  const float* g;
  const float* beta_logits;
  const float* gate;
  const float* norm_weight;
  float norm_eps;
  const float* a_log;
  const float* dt_bias;
  bool has_lower_bound;
  float lower_bound;
  char* state;
  int64_t slot_bytes;
  const int32_t* slot_ids;
  const int32_t* cu_seqlens;  // null: sequence s has rows s · tokens .. + tokens
  int64_t tokens;
  int heads;
  float* out;
  uint16_t* out_bf16;
};

// Sum of one value per thread over the first `warps` warps (all threads of those warps call it); result in every
// thread of the block after the barrier. Fixed order.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <bool kConv>
__global__ void __launch_bounds__(kThreads, 1) kda_recurrent_kernel(RecurrentArgs a) {
  const int h = blockIdx.x;
  const int b = blockIdx.y;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int H = a.heads;
  const int64_t row_width = 3LL * H * kD;

  __shared__ __align__(16) float s_q[kD], s_k[kD], s_v[kD], s_decay[kD], s_u[kD], s_o[kD];
  __shared__ __align__(16) float s_red[2][kWarps][kD];
  __shared__ float s_scalar[8];

  // Weights (never written by another kernel) before the wait: this thread's conv channel's four taps.
  const int part = tid / kD;  // 0 q, 1 k, 2 v, 3 gate/decay
  const int ch = tid % kD;
  const int64_t channel = static_cast<int64_t>(part) * H * kD + static_cast<int64_t>(h) * kD + ch;
  float w[4] = {0.f, 0.f, 0.f, 0.f};
  if (kConv && part < 3) {
    const float4 wv = *reinterpret_cast<const float4*>(a.conv_weight + channel * 4);
    w[0] = wv.x, w[1] = wv.y, w[2] = wv.z, w[3] = wv.w;
  }
  const float a_coef = expf(a.a_log[h]);
  const float dt = (part == 3 && a.dt_bias) ? a.dt_bias[static_cast<int64_t>(h) * kD + ch] : 0.f;
  const float nw = (a.gate && tid < kD) ? a.norm_weight[tid] : 0.f;

  pdl_wait();
  int64_t row0, count;
  if (a.cu_seqlens) {
    row0 = a.cu_seqlens[b];
    count = a.cu_seqlens[b + 1] - row0;
  } else {
    row0 = static_cast<int64_t>(b) * a.tokens;
    count = a.tokens;
  }
  char* slot = a.state + static_cast<int64_t>(a.slot_ids[b]) * a.slot_bytes;
  float* S = reinterpret_cast<float*>(slot) + static_cast<int64_t>(h) * kD * kD;
  float* conv_state = reinterpret_cast<float*>(slot + static_cast<int64_t>(H) * kD * kD * 4);

  float4 st[kRowsPerWarp];
#pragma unroll
  for (int m = 0; m < kRowsPerWarp; ++m)
    st[m] = *reinterpret_cast<const float4*>(S + (warp + kWarps * m) * kD + 4 * lane);
  float c0 = 0.f, c1 = 0.f, c2 = 0.f;
  if (kConv && part < 3) {
    c0 = conv_state[channel];
    c1 = conv_state[row_width + channel];
    c2 = conv_state[2 * row_width + channel];
  }

  for (int64_t t = 0; t < count; ++t) {
    const int64_t row = row0 + t;
    if (part < 3) {
      const float x = bf16_bits_to_float(a.qkv[row * row_width + channel]);
      float y;
      if (kConv) {
        y = round_bf16(conv_silu(w, c0, c1, c2, x));
        c0 = c1, c1 = c2, c2 = x;
      } else {
        y = x;
      }
      (part == 0 ? s_q : part == 1 ? s_k : s_v)[ch] = y;
    } else {
      const float g0 = a.g[row * H * kD + static_cast<int64_t>(h) * kD + ch] + dt;
      s_decay[ch] = expf(forget_gate(g0, a_coef, a.has_lower_bound, a.lower_bound));
      if (ch == 0) s_scalar[3] = sigmoidf(a.beta_logits[row * H + h]);
    }
    __syncthreads();
    if (warp < 3) {
      // Warp 0: Σq², 1: Σk², 2: Σq·k (raw values; normalised below).
      float v = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = lane + 32 * i;
        v += warp == 0 ? s_q[c] * s_q[c] : warp == 1 ? s_k[c] * s_k[c] : s_q[c] * s_k[c];
      }
      v = warp_sum(v);
      if (lane == 0) s_scalar[warp] = v;
    }
    __syncthreads();
    const float rq = rsqrtf(s_scalar[0] + 1e-6f) * rsqrtf(static_cast<float>(kD));
    const float rk = rsqrtf(s_scalar[1] + 1e-6f);
    const float beta = s_scalar[3];
    const float kq = s_scalar[2] * rq * rk;
    float4 pp = make_float4(0.f, 0.f, 0.f, 0.f), aa = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int m = 0; m < kRowsPerWarp; ++m) {
      const int r = warp + kWarps * m;
      const float d = s_decay[r], kr = s_k[r] * rk, qr = s_q[r] * rq;
      st[m].x *= d, st[m].y *= d, st[m].z *= d, st[m].w *= d;
      pp.x += st[m].x * kr, pp.y += st[m].y * kr, pp.z += st[m].z * kr, pp.w += st[m].w * kr;
      aa.x += st[m].x * qr, aa.y += st[m].y * qr, aa.z += st[m].z * qr, aa.w += st[m].w * qr;
    }
    *reinterpret_cast<float4*>(&s_red[0][warp][4 * lane]) = pp;
    *reinterpret_cast<float4*>(&s_red[1][warp][4 * lane]) = aa;
    __syncthreads();
    if (tid < kD) {
      float P = 0.f, A = 0.f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) P += s_red[0][i][tid], A += s_red[1][i][tid];
      const float u = beta * (s_v[tid] - P);
      s_u[tid] = u;
      const float o = A + u * kq;
      s_o[tid] = o;
      if (a.gate) {
        const float ss = warp_sum(o * o);
        if (lane == 0) s_scalar[4 + warp] = ss;
      }
    }
    __syncthreads();
    {
      const float4 u = *reinterpret_cast<const float4*>(&s_u[4 * lane]);
#pragma unroll
      for (int m = 0; m < kRowsPerWarp; ++m) {
        const float kr = s_k[warp + kWarps * m] * rk;
        st[m].x += kr * u.x, st[m].y += kr * u.y, st[m].z += kr * u.z, st[m].w += kr * u.w;
      }
    }
    if (tid < kD) {
      float y = s_o[tid];
      if (a.gate) {
        const float ms = (s_scalar[4] + s_scalar[5] + s_scalar[6] + s_scalar[7]) / kD;
        const float gt = a.gate[row * H * kD + static_cast<int64_t>(h) * kD + tid];
        y = nw * y * rsqrtf(ms + a.norm_eps) * sigmoidf(gt);
      }
      const int64_t o_idx = row * H * kD + static_cast<int64_t>(h) * kD + tid;
      if (a.out) a.out[o_idx] = y;
      if (a.out_bf16) a.out_bf16[o_idx] = float_to_bf16_bits(y);
    }
    __syncthreads();  // s_q / s_k / s_u / s_scalar are rewritten by the next token
  }

#pragma unroll
  for (int m = 0; m < kRowsPerWarp; ++m)
    *reinterpret_cast<float4*>(S + (warp + kWarps * m) * kD + 4 * lane) = st[m];
  if (kConv && part < 3) {
    conv_state[channel] = c0;
    conv_state[row_width + channel] = c1;
    conv_state[2 * row_width + channel] = c2;
  }
  pdl_launch_dependents();
}

Status check_slots(const KdaStateSlots& s, int64_t heads, const char* name) {
  if (!s.state || !s.slot_ids) return invalid_argument(std::string(name) + ": state and slot_ids are required");
  if (s.slot_bytes < kda_state_slot_bytes(heads) || s.slot_bytes % 16 != 0 ||
      reinterpret_cast<uintptr_t>(s.state) % 16 != 0)
    return invalid_argument(std::string(name) + ": slot_bytes must be a multiple of 16 and ≥ " +
                            std::to_string(kda_state_slot_bytes(heads)) + ", state 16-byte aligned");
  return ok_status();
}

}  // namespace

Status kda_recurrent_fallback(const KdaPrefillParams& p, StreamHandle stream);

Status kda_decode(const KdaDecodeParams& p, StreamHandle stream) {
  const char* name = "cuda::kda_decode";
  if (p.heads <= 0 || p.num_seqs < 0 || p.tokens < 0) return invalid_argument(std::string(name) + ": bad shape");
  if (!p.qkv || !p.conv_weight || !p.g || !p.beta_logits || !p.forget.a_log || (!p.out && !p.out_bf16) ||
      (p.gate && !p.norm_weight))
    return invalid_argument(std::string(name) + ": missing input or output");
  KILN_RETURN_IF_ERROR(check_slots(p.slots, p.heads, name));
  if (reinterpret_cast<uintptr_t>(p.conv_weight) % 16 != 0)
    return invalid_argument(std::string(name) + ": conv_weight must be 16-byte aligned");
  if (p.num_seqs == 0 || p.tokens == 0) return ok_status();
  const RecurrentArgs a{p.qkv, p.conv_weight, p.g, p.beta_logits, p.gate, p.norm_weight, p.norm_eps,
                        p.forget.a_log, p.forget.dt_bias, p.forget.has_lower_bound, p.forget.lower_bound,
                        p.slots.state, p.slots.slot_bytes, p.slots.slot_ids, nullptr, p.tokens,
                        static_cast<int>(p.heads), p.out, p.out_bf16};
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.num_seqs));
  return check_cuda(launch_pdl(kda_recurrent_kernel<true>, grid, dim3(kThreads), 0, stream, a), name);
}

// kda_prefill without a usable lower bound: the same kernel over convolved inputs, no conv, raw o.
Status kda_recurrent_fallback(const KdaPrefillParams& p, StreamHandle stream) {
  const RecurrentArgs a{p.qkv, nullptr, p.g, p.beta_logits, nullptr, nullptr, 0.f,
                        p.forget.a_log, p.forget.dt_bias, p.forget.has_lower_bound, p.forget.lower_bound,
                        p.slots.state, p.slots.slot_bytes, p.slots.slot_ids, p.cu_seqlens, 0,
                        static_cast<int>(p.heads), p.out, nullptr};
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.num_seqs));
  return check_cuda(launch_pdl(kda_recurrent_kernel<false>, grid, dim3(kThreads), 0, stream, a),
                    "cuda::kda_prefill (recurrent)");
}

Status kda_check_slots(const KdaStateSlots& s, int64_t heads, const char* name) { return check_slots(s, heads, name); }

}  // namespace kiln::cuda
