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
  const int64_t heads = c.linear_num_heads, d = c.linear_head_dim, ch = c.kda_channels(),
                width = c.linear_conv_kernel_dim;
  // Slot layout (Glm5NextArchitecture::cache_spec): recurrent state, then conv state.
  auto* slots = static_cast<char*>(caches.entry(l, 0));
  const size_t slot_bytes = c.kda_state_bytes(), state_bytes = c.kda_recurrent_bytes();
  if (!slots) return failed_precondition("layer " + std::to_string(l) + " has no KDA state slots");

  std::vector<float> qkv(n * 3 * ch), mixed(n * 3 * ch);
  KILN_RETURN_IF_ERROR(run_linear(*w.qkv, h, n, qkv.data()));
  round_bf16(qkv.data(), n * 3 * ch);
  for (size_t s = 0; s + 1 < tl.seq_begin.size(); ++s) {
    const SequenceStep& st = *tl.steps[s];
    float* conv = reinterpret_cast<float*>(slots + static_cast<size_t>(st.state_slot) * slot_bytes + state_bytes);
    if (st.start_position == 0) std::memset(conv, 0, c.kda_conv_bytes());  // a new sequence
    const int64_t b = tl.seq_begin[s], len = tl.seq_begin[s + 1] - b;
    cpu::kda_short_conv_silu(qkv.data() + b * 3 * ch, len, 3 * ch, w.conv.data(), width, conv,
                             mixed.data() + b * 3 * ch);
  }
  round_bf16(mixed.data(), n * 3 * ch);  // the GPU's conv kernels store the SiLU output in bf16
  std::vector<float> q(n * ch), k(n * ch), v(n * ch);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = mixed.data() + t * 3 * ch;
    std::copy_n(row, ch, q.data() + t * ch);
    std::copy_n(row + ch, ch, k.data() + t * ch);
    std::copy_n(row + 2 * ch, ch, v.data() + t * ch);
  }
  cpu::kda_normalize_qk(q.data(), k.data(), n, heads, d);

  std::vector<float> low(n * d), g(n * ch), beta(n * heads);
  KILN_RETURN_IF_ERROR(run_linear(*w.f_a, h, n, low.data()));
  round_bf16(low.data(), n * d);
  KILN_RETURN_IF_ERROR(run_linear(*w.f_b, low.data(), n, g.data()));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < ch; ++i) g[t * ch + i] += w.dt_bias[i];
  cpu::kda_forget_gate(g.data(), n, heads, d, w.a_log.data(), c.linear_lower_bound.has_value(),
                       static_cast<float>(c.linear_lower_bound.value_or(0.0)));
  KILN_RETURN_IF_ERROR(run_linear(*w.b_proj, h, n, beta.data()));
  cpu::sigmoid(beta.data(), n * heads, beta.data());

  std::vector<float> o(n * ch);
  for (size_t s = 0; s + 1 < tl.seq_begin.size(); ++s) {
    const SequenceStep& st = *tl.steps[s];
    float* state = reinterpret_cast<float*>(slots + static_cast<size_t>(st.state_slot) * slot_bytes);
    if (st.start_position == 0) std::memset(state, 0, state_bytes);
    const int64_t b = tl.seq_begin[s], len = tl.seq_begin[s + 1] - b;
    cpu::kda_recurrent(q.data() + b * ch, k.data() + b * ch, v.data() + b * ch, g.data() + b * ch,
                       beta.data() + b * heads, len, heads, d, d, state, o.data() + b * ch);
  }

  std::vector<float> gate(n * ch);
  KILN_RETURN_IF_ERROR(run_linear(*w.g_a, h, n, low.data()));
  round_bf16(low.data(), n * d);
  KILN_RETURN_IF_ERROR(run_linear(*w.g_b, low.data(), n, gate.data()));
  cpu::kda_gated_rmsnorm(o.data(), gate.data(), w.o_norm.data(), n, heads, d, static_cast<float>(c.rms_norm_eps),
                         o.data());
  round_bf16(o.data(), n * ch);
  KILN_RETURN_IF_ERROR(run_linear(*w.o_proj, o.data(), n, out));
  round_bf16(out, n * c.hidden_size);
  return ok_status();
}

}  // namespace kiln::glm5_next
