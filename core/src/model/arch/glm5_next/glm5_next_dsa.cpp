// The DSA layer of glm5_next on the CPU (specs/glm5-next.md §3): MLA without a rope part, absorbed over the
// 512-wide latent in the recipe's KvLayout, attending through the pooled indexer's selection.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/pooled_indexer.h"
#include "model/arch/glm5_next/glm5_next_model.h"
#include "model/mla_moe_model.h"
#include "model/split_context_attention.h"

namespace kiln::glm5_next {
namespace {

// The latent width the CUDA bf16 layout's tensor-core attention takes (cuda::kMlaLatentDim; the CPU build has no
// CUDA headers): only it rounds the absorbed query to bf16.
constexpr int64_t kGpuTensorCoreLatent = 512;

// The indexer key's LayerNorm (nn.LayerNorm(index_head_dim, eps=1e-6) in transformers).
constexpr float kIndexerNormEps = 1e-6f;

}  // namespace

// Writes the step's indexer rows [k | gate] into the layer's cache, then selects per query: pool keys of every
// complete pool from the cached rows, pool scores, the top pools' tokens and the query's own incomplete pool.
Status Glm5NextModel::indexer_select(const PooledIndexerWeights& w, int64_t l, const TokenLayout& tl,
                                     const CacheViews& caches, const float* h, const float* q_resid,
                                     std::vector<int32_t>& selected) const {
  const Glm5NextConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tl.positions.size()), heads = c.index_n_heads, dim = c.index_head_dim;
  const int64_t pool = c.index_kpool, width = c.selection_width(), row = 2 * dim;
  auto* cache = static_cast<float*>(caches.entry(l, 1));
  if (!cache) return failed_precondition("layer " + std::to_string(l) + " has no indexer key cache");

  std::vector<float> q(n * heads * dim), k(n * dim), gate(n * dim), wts(n * heads);
  KILN_RETURN_IF_ERROR(run_linear(*w.wq_b, q_resid, n, q.data()));
  KILN_RETURN_IF_ERROR(run_linear(*w.wk, h, n, k.data()));
  cpu::layernorm(k.data(), w.k_norm_weight.data(), w.k_norm_bias.data(), n, dim, kIndexerNormEps, k.data());
  cpu::gemm_f32(h, n, c.hidden_size, w.compress_gate.data(), dim, gate.data());
  KILN_RETURN_IF_ERROR(run_linear(*w.weights_proj, h, n, wts.data()));
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(heads));
  for (float& x : wts) x *= head_scale;
  if (writes_kv())
    for (int64_t t = 0; t < n; ++t) {
      if (tl.slots[t] < 0) continue;  // another rank of the decode-context group owns this position
      std::copy_n(k.data() + t * dim, dim, cache + tl.slots[t] * row);
      std::copy_n(gate.data() + t * dim, dim, cache + tl.slots[t] * row + dim);
    }
  // The rows (and the layer's latents, appended before this) are in place before any rank reads them.
  KILN_RETURN_IF_ERROR(sync_ranks());

  selected.assign(n * width, -1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const int64_t page = context_split() ? caches.layout->geometry().block_size : caches.block_size;
  std::vector<float> members_k(pool * dim), members_gate(pool * dim), rows;
  for (size_t s = 0; s + 1 < tl.seq_begin.size(); ++s) {
    const SequenceStep& st = *tl.steps[s];
    const int64_t b = tl.seq_begin[s], len = tl.seq_begin[s + 1] - b;
    const int64_t num_pools = (st.start_position + len) / pool;  // complete pools among the cached tokens
    std::vector<float> pool_keys(num_pools * dim), scores(len * num_pools);
    rows.resize(num_pools * pool * row);
    KILN_RETURN_IF_ERROR(indexer_rows(st, num_pools * pool, cache, page, rows.data()));  // meets the group when split
    for (int64_t p = 0; p < num_pools; ++p) {
      for (int64_t j = 0; j < pool; ++j) {
        const float* src = rows.data() + (p * pool + j) * row;
        std::copy_n(src, dim, members_k.data() + j * dim);
        std::copy_n(src + dim, dim, members_gate.data() + j * dim);
      }
      cpu::pooled_indexer_pool_key(members_k.data(), members_gate.data(), w.ape.data(), pool, dim,
                                   pool_keys.data() + p * dim);
    }
    cpu::pooled_indexer_scores(q.data() + b * heads * dim, wts.data() + b * heads, pool_keys.data(), len, num_pools,
                               heads, dim, scale, scores.data());
    for (int64_t t = 0; t < len; ++t) {
      // transformers' row: the pools of its one-shot prompt, then of each decoded token's keys.
      const int64_t q_pos = st.start_position + t;
      const int64_t row_pools = st.prompt_length >= 0 ? std::max(st.prompt_length, q_pos + 1) / pool : -1;
      cpu::pooled_indexer_select(scores.data() + t * num_pools, num_pools, q_pos, pool, c.index_topk,
                                 c.index_kpool_always_select_tail, selected.data() + (b + t) * width, width,
                                 cpu::PoolTies::kTorchCpu, row_pools);
    }
  }
  return ok_status();
}

SplitContext Glm5NextModel::split_context() const { return {context_group_, context_shard_, weights_.shard}; }

Status Glm5NextModel::indexer_rows(const SequenceStep& st, int64_t ctx, const float* cache, int64_t page,
                                   float* rows) const {
  const int64_t row = 2 * config_.index_head_dim;
  if (!context_split()) {
    for (int64_t t = 0; t < ctx; ++t) std::copy_n(cache + kv_slot(*st.block_table, page, t) * row, row, rows + t * row);
    return ok_status();
  }
  const std::vector<int32_t> table = context_shard_.local_table(*st.block_table);
  return gather_split_rows(split_context(), ctx, row,
                           [&](int64_t local, float* own) {
                             for (int64_t k = 0; k < local; ++k)
                               std::copy_n(cache + (static_cast<int64_t>(table[k / page]) * page + k % page) * row,
                                           row, own + k * row);
                             return ok_status();
                           },
                           rows);
}

Status Glm5NextModel::dsa(const DsaWeights& w, int64_t l, const TokenLayout& tl, const CacheViews& caches,
                          const float* h, float* out, std::vector<int32_t>& selected) const {
  const Glm5NextConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tl.positions.size());
  // This rank's heads (all of them unsharded); the latent, the indexer and its selection are every rank's.
  const int64_t heads = weights_.shard.count(c.num_attention_heads), latent = c.kv_lora_rank,
                nope = c.qk_nope_head_dim, vd = c.v_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);  // q_a / kv_a norms take rms_norm_eps in this model

  std::vector<float> q_resid(n * c.q_lora_rank), q(n * heads * nope), lat(n * latent);
  KILN_RETURN_IF_ERROR(run_linear(*w.q_a, h, n, q_resid.data()));
  round_bf16(q_resid.data(), n * c.q_lora_rank);
  cpu::rmsnorm(q_resid.data(), w.q_a_norm.data(), n, c.q_lora_rank, eps, q_resid.data());
  round_bf16(q_resid.data(), n * c.q_lora_rank);
  KILN_RETURN_IF_ERROR(run_linear(*w.q_b, q_resid.data(), n, q.data()));
  KILN_RETURN_IF_ERROR(run_linear(*w.kv_a, h, n, lat.data()));
  cpu::rmsnorm(lat.data(), w.kv_a_norm.data(), n, latent, eps, lat.data());

  void* pages = caches.entry(l, 0);
  if (!pages) return failed_precondition("layer " + std::to_string(l) + " has no KV pages");
  const KvLayout& layout = *caches.layout;
  KvAppendArgs append;  // rows are the latent alone: the layout's rope part is 0 wide
  append.pages = pages, append.slots = tl.slots.data(), append.n = n, append.rows = lat.data();
  if (writes_kv()) KILN_RETURN_IF_ERROR(layout.append(append, {}));

  if (w.indexer) {
    KILN_RETURN_IF_ERROR(indexer_select(*w.indexer, l, tl, caches, h, q_resid.data(), selected));  // meets the ranks
  } else {
    KILN_RETURN_IF_ERROR(sync_ranks());  // the latents are in place before any rank reads them
    if (w.dense) {
      selected.clear();  // nothing selects: every visible token
    } else if (selected.size() != static_cast<size_t>(n * c.selection_width())) {
      return failed_precondition("layer " + std::to_string(l) + " shares an indexer selection no earlier layer made");
    }
  }

  // Absorbed form: q_lat = q · W_UK per head, attention over the cached latents, o = W_UV · o_lat.
  const cpu::MlaAbsorbDims dims{heads, nope, vd, latent};
  std::vector<float> q_lat(n * heads * latent), o_lat(n * heads * latent), attn(n * heads * vd);
  // bf16: the absorption GEMM reads q in bf16 and writes the absorbed query in fp32. The bf16 layout's tensor-core
  // attention (latent 512, GLM-5.3-Flash's shape) rounds that query to bf16; its plain kernel (any other latent
  // width) reads it in fp32 — rounding it here regardless left a 128-wide latent's rows 0.4 % from the GPU's.
  round_bf16(q.data(), n * heads * nope);
  cpu::mla_absorb_query(q.data(), n, nope, w.kv_b_f32.data(), dims, q_lat.data(), latent);
  if (latent == kGpuTensorCoreLatent) round_bf16(q_lat.data(), n * heads * latent);
  const float scale = 1.0f / std::sqrt(static_cast<float>(nope + c.qk_rope_head_dim));
  const int64_t width = c.selection_width();
  for (size_t s = 0; s + 1 < tl.seq_begin.size(); ++s) {
    const SequenceStep& st = *tl.steps[s];
    const int64_t b = tl.seq_begin[s], len = tl.seq_begin[s + 1] - b;
    if (context_split()) {  // each rank's own tokens, merged across the group
      KILN_RETURN_IF_ERROR(attend_split_context(split_context(), c.num_attention_heads, latent, 0, st, len,
                                                q_lat.data() + b * heads * latent,
                                                w.dense ? nullptr : selected.data() + b * width, w.dense ? 0 : width,
                                                scale, pages, layout, o_lat.data() + b * heads * latent));
      continue;
    }
    std::vector<int32_t> query_seq(len, 0), kv_len(len);
    for (int64_t t = 0; t < len; ++t) kv_len[t] = static_cast<int32_t>(st.start_position + t + 1);
    MlaAttendArgs args;
    args.cache = pages;
    args.num_queries = len;
    args.num_heads = heads;
    args.q = q_lat.data() + b * heads * latent;
    args.block_tables = st.block_table->data();
    args.max_blocks = static_cast<int64_t>(st.block_table->size());
    args.query_seq = query_seq.data();
    args.kv_len = kv_len.data();
    args.selected = w.dense ? nullptr : selected.data() + b * width;
    args.selected_width = w.dense ? 0 : width;
    args.scale = scale;
    args.max_kv_len = st.start_position + len;
    args.out = o_lat.data() + b * heads * latent;
    KILN_RETURN_IF_ERROR(layout.attend(args, {}));
  }
  round_bf16(o_lat.data(), n * heads * latent);
  cpu::mla_unabsorb_output(o_lat.data(), n, w.kv_b_f32.data(), dims, attn.data());
  round_bf16(attn.data(), n * heads * vd);
  const float* o_in = attn.data();
  std::vector<float> all_heads;
  if (sharded()) {  // o_proj runs whole over every head's output
    all_heads.resize(static_cast<size_t>(n * c.num_attention_heads * vd));
    KILN_RETURN_IF_ERROR(gather_units(attn.data(), n, c.num_attention_heads, vd, all_heads.data()));
    o_in = all_heads.data();
  }
  KILN_RETURN_IF_ERROR(run_linear(*w.o_proj, o_in, n, out));
  round_bf16(out, n * c.hidden_size);
  return ok_status();
}

}  // namespace kiln::glm5_next
