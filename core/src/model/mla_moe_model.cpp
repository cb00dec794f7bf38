#include "model/mla_moe_model.h"

#include <limits>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include <omp.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cpu/norm.h"
#include "kiln/drafter.h"
#include "kiln/indexer_key_codec.h"
#include "kiln/log.h"
#include "model/cpu_rank_gathers.h"
#include "model/host_experts_bf16.h"
#include "model/rope_setup.h"

namespace kiln {
namespace {

// HF builds q_a_layernorm and kv_a_layernorm without passing rms_norm_eps: they keep the class default.
constexpr float kLatentNormEps = 1e-6f;
// The DSA indexer's key LayerNorm (nn.LayerNorm(head_dim, eps=1e-6) in HF).
constexpr float kIndexerNormEps = 1e-6f;

void apply_rope(const ModelConfig& c, float* x, int64_t n, int64_t heads, int64_t token_stride, int64_t head_stride,
                const float* cos, const float* sin) {
  if (c.qk_rope_head_dim == 0) return;
  if (c.rope.interleave)
    cpu::apply_rope_interleaved(x, n, heads, token_stride, head_stride, cos, sin, c.qk_rope_head_dim);
  else
    cpu::apply_rope_half_split(x, n, heads, token_stride, head_stride, cos, sin, c.qk_rope_head_dim);
}

}  // namespace

cpu::MoeRouterConfig moe_router_config(const ModelConfig& c) {
  cpu::MoeRouterConfig rc;
  rc.num_experts = c.n_routed_experts;
  rc.top_k = c.num_experts_per_tok;
  rc.n_group = c.n_group;
  rc.topk_group = c.topk_group;
  rc.norm_topk_prob = c.norm_topk_prob;
  rc.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  return rc;
}

Status check_sequence_step(const SequenceStep& st, size_t index, int64_t block_size, const ModelConfig& config) {
  return check_sequence_step(st, index, block_size, config.vocab_size, config.max_position_embeddings);
}

Status check_sequence_step(const SequenceStep& st, size_t index, int64_t block_size, int64_t vocab_size,
                           int64_t max_position_embeddings) {
  const std::string name = "sequence step " + std::to_string(index);
  const int64_t n = static_cast<int64_t>(st.tokens.size());
  if (n == 0) return invalid_argument(name + " has no tokens");
  if (!st.block_table) return invalid_argument(name + " has no block table");
  const int64_t end = st.start_position + n;
  if (static_cast<int64_t>(st.block_table->size()) * block_size < end)
    return invalid_argument(name + ": block table covers " + std::to_string(st.block_table->size() * block_size) +
                            " positions, needs " + std::to_string(end));
  if (max_position_embeddings > 0 && end > max_position_embeddings)
    return out_of_range("position " + std::to_string(end - 1) + " is beyond the model's max_position_embeddings " +
                        std::to_string(max_position_embeddings));
  for (const int32_t id : st.tokens)
    if (id < 0 || id >= vocab_size)
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                              std::to_string(vocab_size) + ")");
  for (const MediaRows& m : st.media)
    if (m.first_row < 0 || m.count < 0 || m.first_row + m.count > n || (m.count > 0 && !m.embeddings))
      return invalid_argument(name + ": media rows [" + std::to_string(m.first_row) + ", " +
                              std::to_string(m.first_row + m.count) + ") are outside its " + std::to_string(n) +
                              " tokens or have no embeddings");
  return ok_status();
}

Status run_linear(const Linear& l, const float* x, int64_t n, float* y) {
  LinearRun run;
  run.x = TensorView::contiguous(const_cast<float*>(x), DType::kF32, {n, l.in_features()});
  run.y = TensorView::contiguous(y, DType::kF32, {n, l.out_features()});
  return l.run(run, {});
}

MlaMoeModel::MlaMoeModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  rope_ = kernel_rope_config(config_);
  if (config_.qk_rope_head_dim > 0) {
    inv_freq_ = cpu::rope_inv_freq(rope_);
    rope_attention_factor_ = cpu::rope_attention_factor(rope_);
  }
}

Status MlaMoeModel::embed(const int32_t* ids, int64_t n, float* out) const {
  return embed_rank_rows(sharded() ? collective_ : nullptr, weights_.shard, weights_.embed_tokens, config_.vocab_size,
                         config_.hidden_size, ids, n, out);
}

Status MlaMoeModel::head_logits(const Linear& head, const float* normed, int64_t n, float* logits) const {
  if (!sharded()) return run_linear(head, normed, n, logits);
  std::vector<float> mine(n * head.out_features());  // this rank's vocabulary rows, then everyone's gathered
  KILN_RETURN_IF_ERROR(run_linear(head, normed, n, mine.data()));
  return gather_units(mine.data(), n, config_.vocab_size, 1, logits);
}

Status MlaMoeModel::sync_ranks() const {
  if (!sharded() || private_cache_) return ok_status();
  float token = 0.0f;
  return collective_->all_reduce(&token, 1, DType::kF32, ReduceOp::kSum, Stream{Device::cpu(), nullptr});
}

Status MlaMoeModel::gather_units(const float* local, int64_t n, int64_t units, int64_t width, float* full) const {
  return gather_rank_units(sharded() ? collective_ : nullptr, weights_.shard, local, n, units, width, full);
}

void MlaMoeModel::round_bf16(float* x, int64_t n) const {
  if (bf16()) cpu::round_to_bf16(x, n);
}

Status MlaMoeModel::lm_head(const float* normed, int64_t n, float* logits) const {
  if (!weights_.lm_head) return failed_precondition("this model has no CPU weights");
  return head_logits(*weights_.lm_head, normed, n, logits);
}

Status MlaMoeModel::make_layout(std::span<const SequenceStep> steps, const CacheViews& caches, TokenLayout& tl) const {
  if (threads_ > 0 && omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
  tl.seq_begin.assign(1, 0);
  tl.positions.clear();
  tl.slots.clear();
  tl.steps.clear();
  const int64_t bs = caches.block_size;
  if (bs <= 0 || !caches.layout) return invalid_argument("the CPU model got no cache memory (block size 0 or no layout)");
  const int64_t page = caches.layout->geometry().block_size;
  if (context_split()) KILN_RETURN_IF_ERROR(context_shard_.check_block_size(bs, page));
  for (size_t s = 0; s < steps.size(); ++s) {
    const SequenceStep& st = steps[s];
    KILN_RETURN_IF_ERROR(check_sequence_step(st, s, bs, config_));
    for (const int32_t blk : *st.block_table)
      if (blk < 0 || blk >= caches.num_blocks)
        return out_of_range("sequence step " + std::to_string(s) + ": block " + std::to_string(blk) +
                            " is outside the KV pool (" + std::to_string(caches.num_blocks) + " blocks)");
    const int64_t n = static_cast<int64_t>(st.tokens.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = st.start_position + i;
      tl.positions.push_back(pos);
      // With the context split, this rank's slot for the positions it owns and −1 (nothing stored) for the rest.
      tl.slots.push_back(context_split() ? context_shard_.slot(*st.block_table, page, pos)
                                         : kv_slot(*st.block_table, bs, pos));
    }
    tl.seq_begin.push_back(static_cast<int64_t>(tl.positions.size()));
    tl.steps.push_back(&st);
  }
  const int64_t N = static_cast<int64_t>(tl.positions.size());
  const int64_t half = config_.qk_rope_head_dim / 2;
  tl.cos.resize(N * half);
  tl.sin.resize(N * half);
  if (half > 0)
    cpu::rope_cos_sin(inv_freq_.data(), half, rope_attention_factor_, tl.positions.data(), N, tl.cos.data(), tl.sin.data());
  return ok_status();
}

bool MlaMoeModel::use_expanded(int64_t new_tokens) const {
  if (form_ != MlaForm::kAuto) return form_ == MlaForm::kExpanded;
  // bf16: the CUDA runner's choice, so each row meets the rounding points of the form the GPU runs it in.
  if (bf16()) return !config_.has_indexer() && new_tokens >= kExpandedPrefillMinTokens;
  return false;  // fp32: one form for every row, whatever the chunking (see MlaForm)
}

Status MlaMoeModel::indexer_select(const IndexerWeights& w, int64_t kv_layer, const TokenLayout& tl,
                                   const CacheViews& caches, const float* h, const float* q_resid,
                                   std::vector<int32_t>& selected, int64_t& selected_width) const {
  const ModelConfig& c = config_;
  const int64_t N = static_cast<int64_t>(tl.positions.size());
  const int64_t Hi = c.index_n_heads, D = c.index_head_dim;
  std::vector<float> q(N * Hi * D), k(N * D), wts(N * Hi);
  KILN_RETURN_IF_ERROR(run_linear(*w.wq_b, q_resid, N, q.data()));
  KILN_RETURN_IF_ERROR(run_linear(*w.wk, h, N, k.data()));
  cpu::layernorm(k.data(), w.k_norm_weight.data(), w.k_norm_bias.data(), N, D, kIndexerNormEps, k.data());
  // The indexer ropes the first qk_rope_head_dim values of q and k (rope part first, unlike MLA).
  apply_rope(c, q.data(), N, Hi, Hi * D, D, tl.cos.data(), tl.sin.data());
  apply_rope(c, k.data(), N, 1, D, D, tl.cos.data(), tl.sin.data());
  KILN_RETURN_IF_ERROR(run_linear(*w.weights_proj, h, N, wts.data()));
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(Hi));
  for (float& x : wts) x *= head_scale;

  // The keys in the layout's format (kiln/indexer_key_format.h): fp32 rows, or e4m3 + scale quantized here on
  // append and read back by the scores row by row.
  auto* cache = static_cast<uint8_t*>(caches.entry(kv_layer, 1));
  if (!cache) return failed_precondition("layer " + std::to_string(kv_layer) + " has no indexer key cache");
  const IndexerKeyFormat key_format = caches.layout->indexer_key_format();
  const bool fp8_keys = key_format == IndexerKeyFormat::kFp8E4m3Scaled;
  const int64_t key_bytes = static_cast<int64_t>(indexer_key_row_bytes(key_format, D));
  if (writes_cache())
    for (int64_t t = 0; t < N; ++t) {
      if (tl.slots[t] < 0) continue;
      uint8_t* row = cache + tl.slots[t] * key_bytes;
      if (fp8_keys)
        encode_indexer_key_fp8(k.data() + t * D, D, row);
      else
        std::memcpy(row, k.data() + t * D, static_cast<size_t>(key_bytes));
    }
  KILN_RETURN_IF_ERROR(sync_ranks());  // this step's keys (and latents) are in before any rank reads

  selected_width = c.index_topk;
  selected.assign(N * selected_width, -1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t bs = caches.block_size;
  int64_t tied = 0;
  for (size_t s = 0; s + 1 < tl.seq_begin.size(); ++s) {
    const int64_t b = tl.seq_begin[s], n = tl.seq_begin[s + 1] - b;
    const SequenceStep& st = *tl.steps[s];
    const int64_t kv_len = st.start_position + n;
    std::vector<float> scores(n * kv_len);
    if (context_split()) {
      KILN_RETURN_IF_ERROR(context_index_scores(st, n, q.data() + b * Hi * D, wts.data() + b * Hi, cache, key_format,
                                                caches.layout->geometry().block_size, scale, scores.data()));
    } else {
      // The sequence's rows in position order, as stored (fp8 rows stay fp8: the scores dequantize them).
      std::vector<uint8_t> keys(static_cast<size_t>(kv_len * key_bytes));
      for (int64_t t = 0; t < kv_len; ++t)
        std::memcpy(keys.data() + t * key_bytes, cache + kv_slot(*st.block_table, bs, t) * key_bytes,
                    static_cast<size_t>(key_bytes));
      if (fp8_keys)
        cpu::dsa_indexer_scores_fp8(q.data() + b * Hi * D, keys.data(), wts.data() + b * Hi, n, kv_len, Hi, D, scale,
                                    scores.data());
      else
        cpu::dsa_indexer_scores(q.data() + b * Hi * D, reinterpret_cast<const float*>(keys.data()),
                                wts.data() + b * Hi, n, kv_len, Hi, D, scale, scores.data());
    }
    // transformers' rows: its one-shot prompt's keys, then each decoded token's own (SequenceStep::prompt_length).
    std::vector<int64_t> row_lengths;
    if (st.prompt_length >= 0)
      for (int64_t t = 0; t < n; ++t) row_lengths.push_back(std::max(st.prompt_length, st.start_position + t + 1));
    tied += cpu::dsa_select_topk(scores.data(), n, kv_len, c.index_topk, selected.data() + b * selected_width,
                                 row_lengths.empty() ? nullptr : row_lengths.data());
  }
  if (tied > 0 && indexer_tied_rows_->fetch_add(tied, std::memory_order_relaxed) == 0) {
    log::warn("DSA indexer (layer {}): in {} of {} rows the top-{} cut fell inside an exact tie of index scores. The "
              "CPU picks among tied keys exactly as torch.topk does on the CPU over transformers' row (its one-shot "
              "prompt, then each token), so it matches transformers run there however the prompt is chunked or "
              "cached; the CUDA runner keeps the lowest positions. Exact ties are common with few indexer heads (a "
              "key whose logits are <= 0 for every head scores exactly 0). Reported once per model.",
              kv_layer, tied, N, c.index_topk);
  }
  return ok_status();
}

Status MlaMoeModel::attention(const AttentionWeights& w, int64_t kv_layer, const TokenLayout& tl,
                              const CacheViews& caches, const float* h, float* out, std::vector<int32_t>& selected,
                              int64_t& selected_width) const {
  const ModelConfig& c = config_;
  const int64_t N = static_cast<int64_t>(tl.positions.size());
  // H: this rank's heads (all of them unsharded).
  const int64_t H = weights_.shard.count(c.num_attention_heads), L = c.kv_lora_rank, R = c.qk_rope_head_dim;
  const int64_t nope = c.qk_nope_head_dim, vd = c.v_head_dim, qk = nope + R;

  std::vector<float> q(N * H * qk), q_resid;
  if (w.q_a) {
    q_resid.resize(N * c.q_lora_rank);
    KILN_RETURN_IF_ERROR(run_linear(*w.q_a, h, N, q_resid.data()));
    round_bf16(q_resid.data(), N * c.q_lora_rank);
    cpu::rmsnorm(q_resid.data(), w.q_a_norm.data(), N, c.q_lora_rank, kLatentNormEps, q_resid.data());
    round_bf16(q_resid.data(), N * c.q_lora_rank);
    KILN_RETURN_IF_ERROR(run_linear(*w.q_b, q_resid.data(), N, q.data()));
  } else {
    KILN_RETURN_IF_ERROR(run_linear(*w.q_proj, h, N, q.data()));
  }
  std::vector<float> ckv(N * (L + R)), latent(N * L), k_pe(N * R);
  KILN_RETURN_IF_ERROR(run_linear(*w.kv_a, h, N, ckv.data()));
  for (int64_t t = 0; t < N; ++t) {
    std::copy_n(ckv.data() + t * (L + R), L, latent.data() + t * L);
    std::copy_n(ckv.data() + t * (L + R) + L, R, k_pe.data() + t * R);
  }
  cpu::rmsnorm(latent.data(), w.kv_a_norm.data(), N, L, kLatentNormEps, latent.data());
  apply_rope(c, q.data() + nope, N, H, H * qk, qk, tl.cos.data(), tl.sin.data());
  apply_rope(c, k_pe.data(), N, 1, R, R, tl.cos.data(), tl.sin.data());

  void* pages = caches.entry(kv_layer, 0);
  if (!pages) return failed_precondition("layer " + std::to_string(kv_layer) + " has no KV pages");
  const KvLayout& layout = *caches.layout;
  // The finished rows (normalised latent, roped k_pe) into the layer's pages.
  for (int64_t t = 0; t < N; ++t) {
    std::copy_n(latent.data() + t * L, L, ckv.data() + t * (L + R));
    std::copy_n(k_pe.data() + t * R, R, ckv.data() + t * (L + R) + L);
  }
  KvAppendArgs append;
  append.pages = pages, append.slots = tl.slots.data(), append.n = N, append.rows = ckv.data();
  if (writes_cache()) KILN_RETURN_IF_ERROR(layout.append(append, {}));

  if (w.indexer) {
    KILN_RETURN_IF_ERROR(
        indexer_select(*w.indexer, kv_layer, tl, caches, h, q_resid.data(), selected, selected_width));
  } else {
    KILN_RETURN_IF_ERROR(sync_ranks());
  }
  // Selection matters only where a query sees more keys than the indexer keeps; elsewhere DSA is dense MLA.
  const bool sparse = c.has_indexer() && !selected.empty();

  const float scale = static_cast<float>(c.attention_scale());
  const cpu::MlaAbsorbDims dims{H, nope, vd, L};
  std::vector<float> attn(N * H * vd);
  for (size_t s = 0; s + 1 < tl.seq_begin.size(); ++s) {
    const int64_t b = tl.seq_begin[s], n = tl.seq_begin[s + 1] - b;
    const SequenceStep& st = *tl.steps[s];
    const int64_t kv_len = st.start_position + n;
    const int32_t* sel = sparse ? selected.data() + b * selected_width : nullptr;
    const int64_t sel_w = sparse ? selected_width : 0;
    if (use_expanded(n)) {
      // Latents of earlier positions come from the cache; this step's are used as computed (not re-read
      // through the layout), as a fresh prefill would. In bf16 precision all of them come from the cache, as the
      // GPU's prefill kernel gathers them.
      const int64_t ctx = bf16() ? kv_len : st.start_position;
      std::vector<float> lat(kv_len * L), rope(kv_len * R);
      if (ctx > 0) {
        std::vector<float> rows(ctx * (L + R));
        if (context_split()) {
          // The prefix from every rank of the group: prefill compute is not split, only the cache.
          KILN_RETURN_IF_ERROR(context_rows(st, ctx, pages, layout, rows.data()));
        } else {
          const KvGatherSeq seq{0, 0, static_cast<int32_t>(ctx), 0};
          KvGatherArgs g;
          g.pages = pages, g.block_tables = st.block_table->data();
          g.max_blocks = static_cast<int64_t>(st.block_table->size()), g.seqs = &seq, g.num_seqs = 1;
          g.max_kv_len = ctx, g.out = rows.data();
          KILN_RETURN_IF_ERROR(layout.gather(g, {}));
        }
        for (int64_t t = 0; t < ctx; ++t) {
          std::copy_n(rows.data() + t * (L + R), L, lat.data() + t * L);
          std::copy_n(rows.data() + t * (L + R) + L, R, rope.data() + t * R);
        }
      }
      if (ctx < kv_len) {
        std::copy_n(latent.data() + b * L, n * L, lat.data() + ctx * L);
        std::copy_n(k_pe.data() + b * R, n * R, rope.data() + ctx * R);
      }
      std::vector<float> kvb(kv_len * H * (nope + vd)), k(kv_len * H * qk), v(kv_len * H * vd);
      KILN_RETURN_IF_ERROR(run_linear(*w.kv_b, lat.data(), kv_len, kvb.data()));
      round_bf16(kvb.data(), kv_len * H * (nope + vd));
      for (int64_t t = 0; t < kv_len; ++t)
        for (int64_t hh = 0; hh < H; ++hh) {
          const float* src = kvb.data() + (t * H + hh) * (nope + vd);
          std::copy_n(src, nope, k.data() + (t * H + hh) * qk);
          std::copy_n(rope.data() + t * R, R, k.data() + (t * H + hh) * qk + nope);
          std::copy_n(src + nope, vd, v.data() + (t * H + hh) * vd);
        }
      cpu::mla_attention_expanded(q.data() + b * H * qk, k.data(), v.data(), n, kv_len, H, qk, vd, scale, sel, sel_w,
                                  attn.data() + b * H * vd);
    } else {
      std::vector<float> qa(n * H * (L + R)), o_lat(n * H * L);
      // bf16: W_UK takes q in bf16 (only q_nope is read); q_pe goes into the absorbed query in fp32 below.
      std::vector<float> q_bf;
      const float* q_abs_in = q.data() + b * H * qk;
      if (bf16()) {
        q_bf.assign(q_abs_in, q_abs_in + n * H * qk);
        round_bf16(q_bf.data(), n * H * qk);
        q_abs_in = q_bf.data();
      }
      cpu::mla_absorb_query(q_abs_in, n, qk, w.kv_b_f32.data(), dims, qa.data(), L + R);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t hh = 0; hh < H; ++hh)
          std::copy_n(q.data() + (b + t) * H * qk + hh * qk + nope, R, qa.data() + (t * H + hh) * (L + R) + L);
      if (context_split()) {
        KILN_RETURN_IF_ERROR(context_attend(st, n, qa.data(), sel, sel_w, scale, pages, layout, o_lat.data()));
      } else {
        std::vector<int32_t> query_seq(n, 0), kv_lens(n);
        for (int64_t t = 0; t < n; ++t) kv_lens[t] = static_cast<int32_t>(st.start_position + t + 1);
        MlaAttendArgs args;
        args.cache = pages;
        args.num_queries = n;
        args.num_heads = H;
        args.q = qa.data();
        args.block_tables = st.block_table->data();
        args.max_blocks = static_cast<int64_t>(st.block_table->size());
        args.query_seq = query_seq.data();
        args.kv_len = kv_lens.data();
        args.selected = sel;
        args.selected_width = sel_w;
        args.scale = scale;
        args.max_kv_len = kv_len;
        args.out = o_lat.data();
        KILN_RETURN_IF_ERROR(layout.attend(args, {}));
      }
      round_bf16(o_lat.data(), n * H * L);
      cpu::mla_unabsorb_output(o_lat.data(), n, w.kv_b_f32.data(), dims, attn.data() + b * H * vd);
    }
  }
  round_bf16(attn.data(), N * H * vd);
  const float* o_in = attn.data();
  std::vector<float> all_heads;
  if (sharded()) {
    all_heads.resize(static_cast<size_t>(N * c.num_attention_heads * vd));
    KILN_RETURN_IF_ERROR(gather_units(attn.data(), N, c.num_attention_heads, vd, all_heads.data()));
    o_in = all_heads.data();
  }
  KILN_RETURN_IF_ERROR(run_linear(*w.o_proj, o_in, N, out));
  round_bf16(out, N * c.hidden_size);
  return ok_status();
}

Status MlaMoeModel::mlp(const LayerWeights& w, const float* h, int64_t n, float* out, float* router_margin) const {
  const ModelConfig& c = config_;
  const int64_t Hd = c.hidden_size;
  // gate / up hold this rank's intermediate columns, down all of them: the activations are gathered first.
  // `expert_form` (bf16: a shared expert the GPU folds into the routed experts' launches): gate / up stay fp32, as a
  // routed expert's do; run apart, the GPU's gate_up Linear stores them in bf16.
  auto dense = [&](const MlpWeights& m, float* y, bool expert_form = false) -> Status {
    const int64_t I = m.gate->out_features(), full = m.down->in_features();
    std::vector<float> g(n * I), u(n * I), a(n * I);
    KILN_RETURN_IF_ERROR(run_linear(*m.gate, h, n, g.data()));
    KILN_RETURN_IF_ERROR(run_linear(*m.up, h, n, u.data()));
    if (!expert_form) {
      round_bf16(g.data(), n * I);
      round_bf16(u.data(), n * I);
    }
    cpu::swiglu(g.data(), u.data(), n, I, I, a.data());
    round_bf16(a.data(), n * I);
    if (sharded()) {
      std::vector<float> all(n * full);
      KILN_RETURN_IF_ERROR(gather_units(a.data(), n, full, 1, all.data()));
      a = std::move(all);
    }
    KILN_RETURN_IF_ERROR(run_linear(*m.down, a.data(), n, y));
    round_bf16(y, n * Hd);
    return ok_status();
  };
  if (!w.is_moe) return dense(w.mlp, out);

  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
  std::vector<float> logits(n * E), weights(n * k);
  std::vector<int32_t> ids(n * k);
  cpu::gemm_f32(h, n, Hd, w.moe.router.data(), E, logits.data());
  const cpu::MoeRouterConfig rc = moe_router_config(c);
  cpu::moe_route(logits.data(), w.moe.router_bias.data(), n, rc, ids.data(), weights.data(), router_margin);
  if (sharded()) {
    // Each pair's output from the one rank that holds its expert (zeros elsewhere, so the group's sum is that
    // output exactly), then a token's pairs summed in slot order as one rank does.
    const int64_t e0 = weights_.shard.begin(E), local = weights_.shard.count(E);
    std::vector<float> pairs(n * k * Hd, 0.0f);
    if (bf16()) {
      KILN_RETURN_IF_ERROR(routed_expert_pairs_bf16(w.moe.expert_mlps, e0, E, h, n, Hd, k, ids.data(),
                                                    weights.data(), pairs.data()));
    } else {
      std::vector<int64_t> mine;
      for (int64_t p = 0; p < n * k; ++p)
        if (ids[p] >= e0 && ids[p] < e0 + local) mine.push_back(p);
      const int64_t P = static_cast<int64_t>(mine.size());
      if (P > 0) {
        std::vector<float> x(P * Hd), pw(P), out_p(P * Hd);
        std::vector<int32_t> pid(P);
        for (int64_t i = 0; i < P; ++i) {
          std::copy_n(h + (mine[i] / k) * Hd, Hd, x.data() + i * Hd);
          pid[i] = static_cast<int32_t>(ids[mine[i]] - e0);
          pw[i] = weights[mine[i]];
        }
        ExpertRun run;  // one pair per row: the set's rows are independent, so each pair is computed as it is
        run.x = TensorView::contiguous(x.data(), DType::kF32, {P, Hd});  // among a token's slots
        run.routing.top_k = 1;
        run.routing.ids = pid.data();
        run.routing.weights = pw.data();
        run.pair_out = out_p.data();
        KILN_RETURN_IF_ERROR(w.moe.experts->run(run, {}).status());
        for (int64_t i = 0; i < P; ++i) std::copy_n(out_p.data() + i * Hd, Hd, pairs.data() + mine[i] * Hd);
      }
    }
    KILN_RETURN_IF_ERROR(
        collective_->all_reduce(pairs.data(), n * k * Hd, DType::kF32, ReduceOp::kSum, Stream{Device::cpu(), nullptr}));
    for (int64_t t = 0; t < n; ++t) {
      float* dst = out + t * Hd;
      std::fill(dst, dst + Hd, 0.0f);
      for (int64_t j = 0; j < k; ++j)
        for (int64_t i = 0; i < Hd; ++i) dst[i] += pairs[(t * k + j) * Hd + i];
    }
  } else if (bf16()) {
    KILN_RETURN_IF_ERROR(routed_experts_bf16(w.moe.expert_mlps, h, n, Hd, k, ids.data(), weights.data(), out));
  } else {
    // Each (token, slot) pair's weighted expert output, then a token's pairs summed in slot order.
    std::vector<float> pairs(n * k * Hd);
    ExpertRun run;
    run.x = TensorView::contiguous(const_cast<float*>(h), DType::kF32, {n, Hd});
    run.routing.top_k = static_cast<int>(k);
    run.routing.ids = ids.data();
    run.routing.weights = weights.data();
    run.pair_out = pairs.data();
    KILN_RETURN_IF_ERROR(w.moe.experts->run(run, {}).status());
    for (int64_t t = 0; t < n; ++t) {
      float* dst = out + t * Hd;
      std::fill(dst, dst + Hd, 0.0f);
      for (int64_t j = 0; j < k; ++j)
        for (int64_t i = 0; i < Hd; ++i) dst[i] += pairs[(t * k + j) * Hd + i];
    }
  }
  if (w.moe.shared.gate) {
    std::vector<float> shared(n * Hd);
    // bf16: up to 32 rows the GPU folds a shared expert of the routed shape into the routed launches; its output is
    // rounded to bf16 either way (dense's last rounding, the combine's when folded).
    const bool folded = bf16() && gpu_folds_shared_expert(
        n, w.moe.shared, w.moe.expert_mlps.empty() ? nullptr : &w.moe.expert_mlps[0], c.moe_intermediate_size);
    KILN_RETURN_IF_ERROR(dense(w.moe.shared, shared.data(), folded));
    for (int64_t i = 0; i < n * Hd; ++i) out[i] += shared[i];
  }
  round_bf16(out, n * Hd);
  return ok_status();
}

Status MlaMoeModel::run_layer(const LayerWeights& layer, int64_t kv_layer, const TokenLayout& tl,
                              const CacheViews& caches, float* x, std::vector<int32_t>& selected,
                              int64_t& selected_width, float* router_margin) const {
  const int64_t N = static_cast<int64_t>(tl.positions.size()), Hd = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<float> h(N * Hd), y(N * Hd);
  cpu::rmsnorm(x, layer.input_norm.data(), N, Hd, eps, h.data());
  round_bf16(h.data(), N * Hd);
  KILN_RETURN_IF_ERROR(attention(layer.attn, kv_layer, tl, caches, h.data(), y.data(), selected, selected_width)
                           .with_context("layer " + std::to_string(kv_layer) + " attention"));
  cpu::add_rmsnorm(y.data(), x, layer.post_attention_norm.data(), N, Hd, eps, h.data());
  round_bf16(h.data(), N * Hd);
  KILN_RETURN_IF_ERROR(mlp(layer, h.data(), N, y.data(), router_margin).with_context("layer " + std::to_string(kv_layer) + " mlp"));
  for (int64_t i = 0; i < N * Hd; ++i) x[i] += y[i];
  return ok_status();
}

Status MlaMoeModel::forward(std::span<const SequenceStep> steps, const CacheViews& caches, const StepOptions& options,
                            StepOutput& out) const {
  const ModelConfig& c = config_;
  if (static_cast<int64_t>(weights_.layers.size()) != c.num_hidden_layers)
    return failed_precondition("this model has no CPU weights (model.load = \"dummy\" lives on the GPU only)");
  for (int tap : options.tap_layers)
    if (tap != kTapFinalNormed && (tap < 0 || tap >= c.num_hidden_layers))
      return out_of_range("tap layer " + std::to_string(tap) + " does not exist (" + std::to_string(c.num_hidden_layers) +
                          " layers)");
  TokenLayout tl;
  KILN_RETURN_IF_ERROR(make_layout(steps, caches, tl));
  const int64_t N = static_cast<int64_t>(tl.positions.size()), Hd = c.hidden_size;

  std::vector<float> x(N * Hd);
  std::vector<int32_t> flat_ids;
  flat_ids.reserve(N);
  for (const auto& st : steps) flat_ids.insert(flat_ids.end(), st.tokens.begin(), st.tokens.end());
  KILN_RETURN_IF_ERROR(embed(flat_ids.data(), N, x.data()));
  // The modality path: media rows replace their placeholder tokens' embeddings.
  for (size_t s = 0; s < steps.size(); ++s)
    for (const MediaRows& m : steps[s].media)
      std::copy_n(m.embeddings, m.count * Hd, x.data() + (tl.seq_begin[s] + m.first_row) * Hd);

  // Tap buffers: one [N, hidden] block per tapped layer, in out.hidden after the normed states (host memory).
  const size_t taps = options.tap_layers.size();
  tap_storage_.assign(taps * N * Hd, 0.0f);
  // Copies `rows` (layer `layer`'s output) into each of its tap blocks (a layer may be asked for twice).
  auto copy_taps = [&](int layer, const float* rows) {
    for (size_t i = 0; i < taps; ++i)
      if (options.tap_layers[i] == layer) std::copy_n(rows, N * Hd, tap_storage_.data() + i * N * Hd);
  };
  const bool final_tap =
      std::find(options.tap_layers.begin(), options.tap_layers.end(), kTapFinalNormed) != options.tap_layers.end();

  // DSA "shared" layers reuse the previous indexer layer's selection, so it lives across layers.
  std::vector<int32_t> selected;
  int64_t selected_width = 0;
  out.router_margin.clear();
  if (options.record_router_margin) out.router_margin.assign(N, std::numeric_limits<float>::infinity());
  float* margin = options.record_router_margin ? out.router_margin.data() : nullptr;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KILN_RETURN_IF_ERROR(run_layer(weights_.layers[l], l, tl, caches, x.data(), selected, selected_width, margin));
    copy_taps(static_cast<int>(l), x.data());
  }

  std::vector<float> normed;
  if (options.want_hidden || final_tap) {
    normed.resize(N * Hd);
    cpu::rmsnorm(x.data(), weights_.final_norm.data(), N, Hd, static_cast<float>(c.rms_norm_eps), normed.data());
    round_bf16(normed.data(), N * Hd);
    copy_taps(kTapFinalNormed, normed.data());
  }
  out.hidden.clear();
  if (options.want_hidden) out.hidden = std::move(normed);
  out.taps.clear();
  for (size_t i = 0; i < taps; ++i)
    out.taps.push_back(TensorView::contiguous(tap_storage_.data() + i * N * Hd, DType::kF32, {N, Hd}));
  return logits(steps, tl, x.data(), weights_.final_norm, *weights_.lm_head, out);
}

Status MlaMoeModel::logits(std::span<const SequenceStep> steps, const TokenLayout& tl, const float* x,
                           const std::vector<float>& norm, const Linear& head, StepOutput& out) const {
  const int64_t Hd = config_.hidden_size;
  // Logits only for the rows asked for: the last token of each step, or all of them.
  std::vector<int64_t> rows;
  out.first_row.clear();
  for (size_t s = 0; s < steps.size(); ++s) {
    out.first_row.push_back(static_cast<int64_t>(rows.size()));
    const int64_t b = tl.seq_begin[s], e = tl.seq_begin[s + 1];
    for (int64_t t = steps[s].all_logits ? b : e - 1; t < e; ++t) rows.push_back(t);
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<float> normed(R * Hd);
  for (int64_t r = 0; r < R; ++r)
    cpu::rmsnorm(x + rows[r] * Hd, norm.data(), 1, Hd, static_cast<float>(config_.rms_norm_eps), normed.data() + r * Hd);
  round_bf16(normed.data(), R * Hd);
  out.logits.resize(R * config_.vocab_size);
  return head_logits(head, normed.data(), R, out.logits.data());
}

Status MlaMoeModel::mtp_forward(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                                const CacheViews& caches, StepOutput& out, bool record_router_margin) const {
  const ModelConfig& c = config_;
  if (mtp_index < 0 || mtp_index >= static_cast<int64_t>(weights_.mtp.size()))
    return out_of_range("MTP layer " + std::to_string(mtp_index) + " is not loaded (" +
                        std::to_string(weights_.mtp.size()) + " present)");
  const MtpWeights& m = weights_.mtp[mtp_index];
  TokenLayout tl;
  KILN_RETURN_IF_ERROR(make_layout(steps, caches, tl));
  const int64_t N = static_cast<int64_t>(tl.positions.size()), Hd = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  std::vector<int32_t> ids;
  ids.reserve(N);
  for (const auto& st : steps) ids.insert(ids.end(), st.tokens.begin(), st.tokens.end());
  std::vector<float> e(N * Hd), hn(N * Hd), cat(N * 2 * Hd), x(N * Hd);
  KILN_RETURN_IF_ERROR(embed(ids.data(), N, e.data()));
  cpu::rmsnorm(e.data(), m.enorm.data(), N, Hd, eps, e.data());
  cpu::rmsnorm(prev_hidden, m.hnorm.data(), N, Hd, eps, hn.data());
  round_bf16(e.data(), N * Hd);
  round_bf16(hn.data(), N * Hd);
  for (int64_t t = 0; t < N; ++t) {  // the embedding first, then the hidden state
    std::copy_n(e.data() + t * Hd, Hd, cat.data() + t * 2 * Hd);
    std::copy_n(hn.data() + t * Hd, Hd, cat.data() + t * 2 * Hd + Hd);
  }
  KILN_RETURN_IF_ERROR(run_linear(*m.eh_proj, cat.data(), N, x.data()));
  std::vector<int32_t> selected;
  int64_t selected_width = 0;
  out.router_margin.clear();
  if (record_router_margin) out.router_margin.assign(N, std::numeric_limits<float>::infinity());
  KILN_RETURN_IF_ERROR(run_layer(m.layer, c.num_hidden_layers + mtp_index, tl, caches, x.data(), selected,
                                 selected_width, record_router_margin ? out.router_margin.data() : nullptr));
  out.hidden = x;
  return logits(steps, tl, x.data(), m.head_norm, m.head ? *m.head : *weights_.lm_head, out);
}

}  // namespace kiln
