#include "model/arch/glm5_next/glm5_next_model.h"

#include <omp.h>

#include <algorithm>
#include <limits>
#include <string>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cpu/norm.h"
#include "kiln/drafter.h"
#include "model/cpu_rank_gathers.h"
#include "model/host_experts_bf16.h"
#include "model/mla_moe_model.h"

namespace kiln::glm5_next {
namespace {

const Stream kHostStream{Device::cpu(), nullptr};

cpu::MhcParams mhc_params(const Glm5NextConfig& c, const MhcWeights& w) {
  cpu::MhcParams p;
  p.fn = w.fn.data(), p.base = w.base.data(), p.scale = w.scale.data();
  p.streams = c.hc_mult, p.dim = c.hidden_size;
  p.rms_eps = static_cast<float>(c.rms_norm_eps), p.hc_eps = static_cast<float>(c.hc_eps);
  p.sinkhorn_iters = c.hc_sinkhorn_iters;
  return p;
}

}  // namespace

Status Glm5NextModel::embed(const int32_t* ids, int64_t n, float* out) const {
  return embed_rank_rows(sharded() ? collective_ : nullptr, weights_.shard, weights_.embed_tokens, config_.vocab_size,
                         config_.hidden_size, ids, n, out);
}

Status Glm5NextModel::sync_ranks() const {
  if (!sharded() || private_cache_) return ok_status();
  float token = 0.0f;
  return collective_->all_reduce(&token, 1, DType::kF32, ReduceOp::kSum, kHostStream);
}

Status Glm5NextModel::gather_units(const float* local, int64_t n, int64_t units, int64_t width, float* full) const {
  return gather_rank_units(sharded() ? collective_ : nullptr, weights_.shard, local, n, units, width, full);
}

Status Glm5NextModel::head_logits(const Linear& head, const float* normed, int64_t n, float* logits) const {
  if (!sharded()) return run_linear(head, normed, n, logits);
  std::vector<float> mine(n * head.out_features());  // this rank's vocabulary rows, then everyone's gathered
  KILN_RETURN_IF_ERROR(run_linear(head, normed, n, mine.data()));
  return gather_units(mine.data(), n, config_.vocab_size, 1, logits);
}

void Glm5NextModel::round_bf16(float* x, int64_t n) const {
  if (bf16()) cpu::round_to_bf16(x, n);
}

Status Glm5NextModel::lm_head(const float* normed, int64_t n, float* logits) const {
  return head_logits(*weights_.lm_head, normed, n, logits);
}

Status Glm5NextModel::make_layout(std::span<const SequenceStep> steps, const CacheViews& caches, bool state,
                                  TokenLayout& tl) const {
  if (threads_ > 0 && omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
  const int64_t bs = caches.block_size;
  if (bs <= 0 || !caches.layout)
    return invalid_argument("the CPU model got no cache memory (block size 0 or no layout)");
  const int64_t page = caches.layout->geometry().block_size;
  if (context_split()) KILN_RETURN_IF_ERROR(context_shard_.check_block_size(bs, page));
  tl = TokenLayout{};
  tl.seq_begin.push_back(0);
  for (size_t s = 0; s < steps.size(); ++s) {
    const SequenceStep& st = steps[s];
    KILN_RETURN_IF_ERROR(check_sequence_step(st, s, bs, config_.vocab_size, config_.max_position_embeddings));
    if (state && st.state_slot < 0)
      return invalid_argument("sequence step " + std::to_string(s) +
                              " has no state slot; glm5_next keeps recurrent KDA state per sequence");
    for (const int32_t blk : *st.block_table)
      if (blk < 0 || blk >= caches.num_blocks)
        return out_of_range("sequence step " + std::to_string(s) + ": block " + std::to_string(blk) +
                            " is outside the KV pool (" + std::to_string(caches.num_blocks) + " blocks)");
    for (int64_t i = 0; i < static_cast<int64_t>(st.tokens.size()); ++i) {
      const int64_t pos = st.start_position + i;
      tl.positions.push_back(pos);
      // With the context split, this rank's slot for the positions it owns and −1 (nothing stored) for the rest.
      tl.slots.push_back(context_split() ? context_shard_.slot(*st.block_table, page, pos)
                                         : kv_slot(*st.block_table, bs, pos));
    }
    tl.seq_begin.push_back(static_cast<int64_t>(tl.positions.size()));
    tl.steps.push_back(&st);
  }
  return ok_status();
}

// bf16: the fused gate_up Linear rounds each half to bf16 before the SwiGLU, whose output is stored in bf16, and down
// stores bf16. `folded` (bf16 precision, few rows): the shared expert folded into the routed experts' launches keeps
// gate / up in fp32 as a routed expert does, and the combine rounds its output as dense_mlp stores it. Sharded, gate /
// up hold this rank's intermediate columns and down all of them: the activations are gathered first.
Status Glm5NextModel::dense_mlp(const MlpWeights& m, const float* h, int64_t n, float* out, bool folded) const {
  const int64_t inter = m.gate->out_features(), full = m.down->in_features();
  std::vector<float> g(n * inter), u(n * inter), a(n * inter);
  KILN_RETURN_IF_ERROR(run_linear(*m.gate, h, n, g.data()));
  KILN_RETURN_IF_ERROR(run_linear(*m.up, h, n, u.data()));
  if (!folded) {
    round_bf16(g.data(), n * inter);
    round_bf16(u.data(), n * inter);
  }
  cpu::swiglu(g.data(), u.data(), n, inter, inter, a.data(), static_cast<float>(config_.swiglu_limit));
  round_bf16(a.data(), n * inter);
  if (sharded()) {
    std::vector<float> all(n * full);
    KILN_RETURN_IF_ERROR(gather_units(a.data(), n, full, 1, all.data()));
    a = std::move(all);
  }
  KILN_RETURN_IF_ERROR(run_linear(*m.down, a.data(), n, out));
  round_bf16(out, n * config_.hidden_size);
  return ok_status();
}

// out [n, hidden]: each token's (token, slot) pairs' weighted expert outputs summed in slot order.
Status Glm5NextModel::routed_experts(const MoeWeights& moe, const float* h, int64_t n, const int32_t* ids,
                                     const float* route, float* out) const {
  const Glm5NextConfig& c = config_;
  const int64_t hd = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
  const float limit = static_cast<float>(c.swiglu_limit);
  if (!sharded() && bf16()) return routed_experts_bf16(moe.expert_mlps, h, n, hd, k, ids, route, out, limit);
  std::vector<float> pairs(n * k * hd, 0.0f);
  if (!sharded()) {
    ExpertRun run;
    run.x = TensorView::contiguous(const_cast<float*>(h), DType::kF32, {n, hd});
    run.routing.top_k = static_cast<int>(k);
    run.routing.ids = ids;
    run.routing.weights = route;
    run.pair_out = pairs.data();
    run.swiglu_limit = limit;
    KILN_RETURN_IF_ERROR(moe.experts->run(run, {}).status());
  } else {
    // Each pair's output from the one rank that holds its expert (zeros elsewhere, so the group's sum is that output
    // exactly), as MlaMoeModel does.
    const int64_t e0 = weights_.shard.begin(E), local = weights_.shard.count(E);
    if (bf16()) {
      KILN_RETURN_IF_ERROR(
          routed_expert_pairs_bf16(moe.expert_mlps, e0, E, h, n, hd, k, ids, route, pairs.data(), limit));
    } else {
      std::vector<int64_t> mine;
      for (int64_t p = 0; p < n * k; ++p)
        if (ids[p] >= e0 && ids[p] < e0 + local) mine.push_back(p);
      const int64_t P = static_cast<int64_t>(mine.size());
      if (P > 0) {
        std::vector<float> x(P * hd), pw(P), out_p(P * hd);
        std::vector<int32_t> pid(P);
        for (int64_t i = 0; i < P; ++i) {
          std::copy_n(h + (mine[i] / k) * hd, hd, x.data() + i * hd);
          pid[i] = static_cast<int32_t>(ids[mine[i]] - e0);
          pw[i] = route[mine[i]];
        }
        ExpertRun run;  // one pair per row: the set's rows are independent, so each pair is computed as among its
        run.x = TensorView::contiguous(x.data(), DType::kF32, {P, hd});  // token's slots
        run.routing.top_k = 1;
        run.routing.ids = pid.data();
        run.routing.weights = pw.data();
        run.pair_out = out_p.data();
        run.swiglu_limit = limit;
        KILN_RETURN_IF_ERROR(moe.experts->run(run, {}).status());
        for (int64_t i = 0; i < P; ++i) std::copy_n(out_p.data() + i * hd, hd, pairs.data() + mine[i] * hd);
      }
    }
    KILN_RETURN_IF_ERROR(collective_->all_reduce(pairs.data(), n * k * hd, DType::kF32, ReduceOp::kSum, kHostStream));
  }
  for (int64_t t = 0; t < n; ++t) {  // a token's pairs summed in slot order
    float* dst = out + t * hd;
    std::fill(dst, dst + hd, 0.0f);
    for (int64_t j = 0; j < k; ++j)
      for (int64_t i = 0; i < hd; ++i) dst[i] += pairs[(t * k + j) * hd + i];
  }
  return ok_status();
}

Status Glm5NextModel::mlp(const LayerWeights& w, const float* h, int64_t n, float* out, float* router_margin) const {
  const Glm5NextConfig& c = config_;
  if (!w.is_moe) return dense_mlp(w.mlp, h, n, out);
  const int64_t hd = c.hidden_size, experts = c.n_routed_experts, k = c.num_experts_per_tok;
  // The router in fp32: sigmoid scores, top-k by score + correction bias, unbiased weights normalised × scaling.
  std::vector<float> logits(n * experts), route(n * k);
  std::vector<int32_t> ids(n * k);
  cpu::gemm_f32(h, n, hd, w.moe.router.data(), experts, logits.data());
  cpu::MoeRouterConfig rc;
  rc.num_experts = experts, rc.top_k = k, rc.n_group = c.n_group, rc.topk_group = c.topk_group;
  rc.norm_topk_prob = c.norm_topk_prob, rc.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  cpu::moe_route(logits.data(), w.moe.router_bias.data(), n, rc, ids.data(), route.data(), router_margin);
  KILN_RETURN_IF_ERROR(routed_experts(w.moe, h, n, ids.data(), route.data(), out));
  if (w.moe.shared.gate) {
    std::vector<float> shared(n * hd);
    // bf16: the GPU folds a shared expert of the routed experts' shape into their launches in batch-invariant steps
    // (up to 32 rows: gate / up stay fp32), else runs it as a dense MLP (gate_up stored in bf16); bf16 output both.
    const bool folded = bf16() && gpu_folds_shared_expert(
        n, w.moe.shared, w.moe.expert_mlps.empty() ? nullptr : &w.moe.expert_mlps[0], c.moe_intermediate_size);
    KILN_RETURN_IF_ERROR(dense_mlp(w.moe.shared, h, n, shared.data(), folded));
    for (int64_t i = 0; i < n * hd; ++i) out[i] += shared[i];
  }
  round_bf16(out, n * hd);
  return ok_status();
}

Status Glm5NextModel::run_layer(const LayerWeights& w, int64_t l, const TokenLayout& tl, const CacheViews& caches,
                                float* x, std::vector<int32_t>& selected, float* router_margin) const {
  const Glm5NextConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tl.positions.size()), hd = c.hidden_size, s = c.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> h(n * hd), y(n * hd);
  const std::string where = "layer " + std::to_string(l);
  auto attention = [&] {
    if (w.kda) return kda(*w.kda, l, tl, caches, h.data(), y.data()).with_context(where + " KDA");
    return dsa(*w.dsa, l, tl, caches, h.data(), y.data(), selected).with_context(where + " DSA");
  };
  // Blocks return their output rounded where the GPU stores it in bf16; the residual (streams) stays fp32.
  if (!w.hyper_connections) {  // x += attn(input_norm(x)); x += mlp(post_attention_norm(x))
    cpu::rmsnorm(x, w.input_norm.data(), n, hd, eps, h.data());
    round_bf16(h.data(), n * hd);
    KILN_RETURN_IF_ERROR(attention());
    for (int64_t i = 0; i < n * hd; ++i) x[i] += y[i];
    cpu::rmsnorm(x, w.post_attention_norm.data(), n, hd, eps, h.data());
    round_bf16(h.data(), n * hd);
    KILN_RETURN_IF_ERROR(mlp(w, h.data(), n, y.data(), router_margin).with_context(where + " MLP"));
    for (int64_t i = 0; i < n * hd; ++i) x[i] += y[i];
    return ok_status();
  }
  std::vector<float> pre(n * s), post(n * s), comb(n * s * s);
  cpu::mhc_maps(x, n, mhc_params(c, w.attn_hc), pre.data(), post.data(), comb.data());
  cpu::mhc_collapse(x, pre.data(), n, s, hd, h.data());
  round_bf16(h.data(), n * hd);
  cpu::rmsnorm(h.data(), w.input_norm.data(), n, hd, eps, h.data());
  round_bf16(h.data(), n * hd);
  KILN_RETURN_IF_ERROR(attention());
  cpu::mhc_mix(x, y.data(), post.data(), comb.data(), n, s, hd);

  cpu::mhc_maps(x, n, mhc_params(c, w.ffn_hc), pre.data(), post.data(), comb.data());
  cpu::mhc_collapse(x, pre.data(), n, s, hd, h.data());
  round_bf16(h.data(), n * hd);
  cpu::rmsnorm(h.data(), w.post_attention_norm.data(), n, hd, eps, h.data());
  round_bf16(h.data(), n * hd);
  KILN_RETURN_IF_ERROR(mlp(w, h.data(), n, y.data(), router_margin).with_context(where + " MLP"));
  cpu::mhc_mix(x, y.data(), post.data(), comb.data(), n, s, hd);
  return ok_status();
}

namespace {

// Each token's streams [n, streams, hd] → their plain mean [n, hd] (the model's final collapse: no learned weights).
void mean_of_streams(const float* x, int64_t n, int64_t streams, int64_t hd, float* out) {
  std::fill(out, out + n * hd, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    float* dst = out + t * hd;
    for (int64_t j = 0; j < streams; ++j)
      for (int64_t i = 0; i < hd; ++i) dst[i] += x[(t * streams + j) * hd + i];
    for (int64_t i = 0; i < hd; ++i) dst[i] /= static_cast<float>(streams);
  }
}

}  // namespace

Status Glm5NextModel::logits(const TokenLayout& tl, const float* normed, const Linear& head, StepOutput& out) const {
  const int64_t hd = config_.hidden_size;
  std::vector<int64_t> rows;  // the last token of each step, or all of them
  out.first_row.clear();
  for (size_t i = 0; i < tl.steps.size(); ++i) {
    out.first_row.push_back(static_cast<int64_t>(rows.size()));
    const int64_t b = tl.seq_begin[i], end = tl.seq_begin[i + 1];
    for (int64_t t = tl.steps[i]->all_logits ? b : end - 1; t < end; ++t) rows.push_back(t);
  }
  const int64_t r = static_cast<int64_t>(rows.size());
  std::vector<float> picked(r * hd);
  for (int64_t i = 0; i < r; ++i) std::copy_n(normed + rows[i] * hd, hd, picked.data() + i * hd);
  out.logits.resize(r * config_.vocab_size);
  return head_logits(head, picked.data(), r, out.logits.data());
}

Status Glm5NextModel::mtp_forward(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                                  const CacheViews& caches, StepOutput& out) const {
  const Glm5NextConfig& c = config_;
  if (mtp_index < 0 || mtp_index >= static_cast<int64_t>(weights_.mtp.size()))
    return out_of_range("next-n layer " + std::to_string(mtp_index) + " is not loaded (" +
                        std::to_string(weights_.mtp.size()) + " present)");
  const MtpLayerWeights& m = weights_.mtp[mtp_index];
  TokenLayout tl;
  KILN_RETURN_IF_ERROR(make_layout(steps, caches, m.layer.kda != nullptr, tl));
  const int64_t n = static_cast<int64_t>(tl.positions.size()), hd = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  std::vector<int32_t> ids;
  ids.reserve(n);
  for (const SequenceStep& st : steps) ids.insert(ids.end(), st.tokens.begin(), st.tokens.end());
  std::vector<float> e(n * hd), hn(n * hd), cat(n * 2 * hd), x0(n * hd);
  KILN_RETURN_IF_ERROR(embed(ids.data(), n, e.data()));
  cpu::rmsnorm(e.data(), m.enorm.data(), n, hd, eps, e.data());
  round_bf16(e.data(), n * hd);
  std::copy_n(prev_hidden, n * hd, hn.data());
  round_bf16(hn.data(), n * hd);  // the GPU normalises the hidden rows as bf16
  cpu::rmsnorm(hn.data(), m.hnorm.data(), n, hd, eps, hn.data());
  round_bf16(hn.data(), n * hd);
  for (int64_t t = 0; t < n; ++t) {  // the embedding's half first, then the hidden state's
    std::copy_n(e.data() + t * hd, hd, cat.data() + t * 2 * hd);
    std::copy_n(hn.data() + t * hd, hd, cat.data() + t * 2 * hd + hd);
  }
  KILN_RETURN_IF_ERROR(run_linear(*m.eh_proj, cat.data(), n, x0.data()));

  const int64_t layer = c.num_hidden_layers + mtp_index;
  std::vector<int32_t> selected;
  out.router_margin.clear();
  out.hidden.resize(n * hd);
  if (m.layer.hyper_connections) {  // hc_mult copies of x as the streams, as the trunk starts from its embedding
    const int64_t s = c.hc_mult;
    std::vector<float> x(n * s * hd);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < s; ++j) std::copy_n(x0.data() + t * hd, hd, x.data() + (t * s + j) * hd);
    KILN_RETURN_IF_ERROR(run_layer(m.layer, layer, tl, caches, x.data(), selected, nullptr));
    mean_of_streams(x.data(), n, s, hd, out.hidden.data());
  } else {
    KILN_RETURN_IF_ERROR(run_layer(m.layer, layer, tl, caches, x0.data(), selected, nullptr));
    std::copy(x0.begin(), x0.end(), out.hidden.begin());
  }
  std::vector<float> normed(out.hidden);
  if (m.layer.hyper_connections) round_bf16(normed.data(), n * hd);  // the GPU norms the streams' mean as bf16
  cpu::rmsnorm(normed.data(), m.head_norm.data(), n, hd, eps, normed.data());
  round_bf16(normed.data(), n * hd);
  out.taps.clear();
  return logits(tl, normed.data(), m.head ? *m.head : *weights_.lm_head, out);
}

Status Glm5NextModel::forward(std::span<const SequenceStep> steps, const CacheViews& caches, const StepOptions& options,
                              StepOutput& out) const {
  const Glm5NextConfig& c = config_;
  for (int tap : options.tap_layers)
    if (tap != kTapFinalNormed && (tap < 0 || tap >= c.num_hidden_layers))
      return out_of_range("tap layer " + std::to_string(tap) + " does not exist (" + std::to_string(c.num_hidden_layers) +
                          " layers)");
  TokenLayout tl;
  const bool state =
      std::find(c.attention.begin(), c.attention.end(), AttentionKind::kKda) != c.attention.end();
  KILN_RETURN_IF_ERROR(make_layout(steps, caches, state, tl));
  const int64_t n = static_cast<int64_t>(tl.positions.size()), hd = c.hidden_size, s = c.hc_mult;

  std::vector<int32_t> ids;
  ids.reserve(n);
  for (const SequenceStep& st : steps) ids.insert(ids.end(), st.tokens.begin(), st.tokens.end());
  std::vector<float> e(n * hd);
  KILN_RETURN_IF_ERROR(embed(ids.data(), n, e.data()));
  for (size_t i = 0; i < steps.size(); ++i)  // media rows replace their placeholders' embeddings
    for (const MediaRows& m : steps[i].media)
      std::copy_n(m.embeddings, m.count * hd, e.data() + (tl.seq_begin[i] + m.first_row) * hd);
  round_bf16(e.data(), n * hd);  // the GPU's embedding rows (and media rows) are bf16
  std::vector<float> x(n * s * hd);  // the residual streams [n, hc_mult, hidden], each starting as the embedding
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < s; ++j) std::copy_n(e.data() + t * hd, hd, x.data() + (t * s + j) * hd);

  out.router_margin.clear();
  if (options.record_router_margin) out.router_margin.assign(n, std::numeric_limits<float>::infinity());
  float* margin = options.record_router_margin ? out.router_margin.data() : nullptr;
  // A shared DSA layer reuses the selection of the full layer just before it.
  // A drafter's tap of layer l (DFlash's target_layer_ids) is the layer's output as one row a token: the plain mean
  // of its hyper-connection streams, as the final norm's input is (transformers records the streams unreduced; the
  // serving ports that run DFlash on this architecture contract them so). kTapFinalNormed: the final-normed row.
  const size_t taps = options.tap_layers.size();
  tap_storage_.assign(taps * n * hd, 0.0f);
  std::vector<int32_t> selected;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KILN_RETURN_IF_ERROR(run_layer(weights_.layers[l], l, tl, caches, x.data(), selected, margin));
    for (size_t i = 0; i < taps; ++i)
      if (options.tap_layers[i] == l) mean_of_streams(x.data(), n, s, hd, tap_storage_.data() + i * n * hd);
  }

  std::vector<float> normed(n * hd);
  mean_of_streams(x.data(), n, s, hd, normed.data());
  round_bf16(normed.data(), n * hd);
  cpu::rmsnorm(normed.data(), weights_.final_norm.data(), n, hd, static_cast<float>(c.rms_norm_eps), normed.data());
  round_bf16(normed.data(), n * hd);
  KILN_RETURN_IF_ERROR(logits(tl, normed.data(), *weights_.lm_head, out));
  for (size_t i = 0; i < taps; ++i)
    if (options.tap_layers[i] == kTapFinalNormed) std::copy_n(normed.data(), n * hd, tap_storage_.data() + i * n * hd);
  out.hidden.clear();
  out.taps.clear();
  if (options.want_hidden) out.hidden = std::move(normed);
  for (size_t i = 0; i < taps; ++i)
    out.taps.push_back(TensorView::contiguous(tap_storage_.data() + i * n * hd, DType::kF32, {n, hd}));
  return ok_status();
}

}  // namespace kiln::glm5_next
