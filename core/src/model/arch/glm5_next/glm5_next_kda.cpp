// The KDA (linear attention) layer of glm5_next on the CPU (specs/glm5-next.md §2).
//
// The kernel runs in its recurrent form for every token count, prompt chunks included, not the chunked (WY) form
// transformers uses for prefill: the recurrence reads each token once in order from the stored state, so a
// sequence's output is the same whether its prompt arrives in one step, in chunks of any size or token by token,
// and equals the chunked form up to fp32 rounding (kernels/cpu/kda.h; tested equal there).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/kda.h"
#include "model/arch/glm5_next/glm5_next_model.h"
#include "model/mla_moe_model.h"

namespace kiln::glm5_next {

Status Glm5NextModel::kda(const KdaWeights& w, int64_t l, const TokenLayout& tl, const CacheViews& caches,
                          const float* h, float* out) const {
  const Glm5NextConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tl.positions.size());
  const int64_t d = c.linear_head_dim, ch = c.kda_channels(), width = c.linear_conv_kernel_dim;
  // This rank's heads [h0, h0 + heads) (all of them unsharded): lc channels of each of q, k, v.
  const int64_t heads = weights_.shard.count(c.linear_num_heads), h0 = weights_.shard.begin(c.linear_num_heads);
  const int64_t lc = heads * d;
  // Slot layout (Glm5NextArchitecture::cache_spec): recurrent state [slot heads, dk, dv], then conv state
  // [kernel − 1, 3 · slot heads · d]. Ranks sharing one pool (threads) hold slots of every head and each reads and
  // writes only its heads' parts; a rank with a pool of its own (private_cache_) holds slots of the largest share
  // of the heads (cache_spec's state_shares) and its heads from the start.
  auto* slots = static_cast<char*>(caches.entry(l, 0));
  const int64_t slot_heads = private_cache_ ? weights_.shard.max_count(c.linear_num_heads) : c.linear_num_heads;
  const int64_t sh0 = private_cache_ ? 0 : h0, sc0 = sh0 * d, sch = slot_heads * d;
  const size_t slot_bytes = c.kda_state_bytes(slot_heads), state_bytes = c.kda_recurrent_bytes(slot_heads);
  const size_t head_state = static_cast<size_t>(d * d);  // floats of one head's recurrent state
  if (!slots) return failed_precondition("layer " + std::to_string(l) + " has no KDA state slots");

  std::vector<float> qkv(n * 3 * lc), mixed(n * 3 * lc), conv_local((width - 1) * 3 * lc);
  KILN_RETURN_IF_ERROR(run_linear(*w.qkv, h, n, qkv.data()));
  round_bf16(qkv.data(), n * 3 * lc);
  for (size_t s = 0; s + 1 < tl.seq_begin.size(); ++s) {
    const SequenceStep& st = *tl.steps[s];
    float* conv = reinterpret_cast<float*>(slots + static_cast<size_t>(st.state_slot) * slot_bytes + state_bytes);
    // This rank's channels of the stored inputs, [kernel − 1, 3·lc] (q, k, v parts each its heads').
    for (int64_t r = 0; r < width - 1; ++r)
      for (int64_t part = 0; part < 3; ++part) {
        float* mine = conv_local.data() + (r * 3 + part) * lc;
        if (st.start_position == 0) {
          std::fill(mine, mine + lc, 0.0f);  // a new sequence
        } else {
          std::copy_n(conv + r * 3 * sch + part * sch + sc0, lc, mine);
        }
      }
    const int64_t b = tl.seq_begin[s], len = tl.seq_begin[s + 1] - b;
    cpu::kda_short_conv_silu(qkv.data() + b * 3 * lc, len, 3 * lc, w.conv.data(), width, conv_local.data(),
                             mixed.data() + b * 3 * lc);
    for (int64_t r = 0; r < width - 1; ++r)
      for (int64_t part = 0; part < 3; ++part)
        std::copy_n(conv_local.data() + (r * 3 + part) * lc, lc, conv + r * 3 * sch + part * sch + sc0);
  }
  round_bf16(mixed.data(), n * 3 * lc);  // the GPU's conv kernels store the SiLU output in bf16
  std::vector<float> q(n * lc), k(n * lc), v(n * lc);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = mixed.data() + t * 3 * lc;
    std::copy_n(row, lc, q.data() + t * lc);
    std::copy_n(row + lc, lc, k.data() + t * lc);
    std::copy_n(row + 2 * lc, lc, v.data() + t * lc);
  }
  cpu::kda_normalize_qk(q.data(), k.data(), n, heads, d);

  std::vector<float> low(n * d), g(n * lc), beta(n * heads);
  KILN_RETURN_IF_ERROR(run_linear(*w.f_a, h, n, low.data()));
  round_bf16(low.data(), n * d);
  KILN_RETURN_IF_ERROR(run_linear(*w.f_b, low.data(), n, g.data()));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < lc; ++i) g[t * lc + i] += w.dt_bias[i];
  cpu::kda_forget_gate(g.data(), n, heads, d, w.a_log.data(), c.linear_lower_bound.has_value(),
                       static_cast<float>(c.linear_lower_bound.value_or(0.0)));
  KILN_RETURN_IF_ERROR(run_linear(*w.b_proj, h, n, beta.data()));
  cpu::sigmoid(beta.data(), n * heads, beta.data());

  std::vector<float> o(n * lc);
  for (size_t s = 0; s + 1 < tl.seq_begin.size(); ++s) {
    const SequenceStep& st = *tl.steps[s];
    float* state = reinterpret_cast<float*>(slots + static_cast<size_t>(st.state_slot) * slot_bytes) + sh0 * head_state;
    if (st.start_position == 0) std::fill(state, state + heads * head_state, 0.0f);
    const int64_t b = tl.seq_begin[s], len = tl.seq_begin[s + 1] - b;
    cpu::kda_recurrent(q.data() + b * lc, k.data() + b * lc, v.data() + b * lc, g.data() + b * lc,
                       beta.data() + b * heads, len, heads, d, d, state, o.data() + b * lc);
  }

  std::vector<float> gate(n * lc);
  KILN_RETURN_IF_ERROR(run_linear(*w.g_a, h, n, low.data()));
  round_bf16(low.data(), n * d);
  KILN_RETURN_IF_ERROR(run_linear(*w.g_b, low.data(), n, gate.data()));
  cpu::kda_gated_rmsnorm(o.data(), gate.data(), w.o_norm.data(), n, heads, d, static_cast<float>(c.rms_norm_eps),
                         o.data());
  round_bf16(o.data(), n * lc);
  const float* o_in = o.data();
  std::vector<float> all_heads;
  if (sharded()) {  // o_proj runs whole over every head's output
    all_heads.resize(static_cast<size_t>(n * ch));
    KILN_RETURN_IF_ERROR(gather_units(o.data(), n, c.linear_num_heads, d, all_heads.data()));
    o_in = all_heads.data();
  }
  KILN_RETURN_IF_ERROR(run_linear(*w.o_proj, o_in, n, out));
  round_bf16(out, n * c.hidden_size);
  return ok_status();
}

}  // namespace kiln::glm5_next
