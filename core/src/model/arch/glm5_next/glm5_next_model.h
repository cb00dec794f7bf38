// The forward pass of glm5_next (GLM-5.3-Flash) on the CPU in fp32 — the reference against transformers 5.17 and
// for the CUDA runner to come (specs/glm5-next.md §1–3). A batch of sequences at different positions in one call:
//   embed → hc_mult copies of the row (the residual streams) → per layer: the attn_hc maps collapse the streams,
//   input_layernorm, KDA or DSA, mixed back into the streams; the ffn_hc maps, post_attention_layernorm, the
//   clamped-SwiGLU MLP or MoE, mixed back → the mean of the streams → norm → lm_head.
// Caches, per layer as the architecture's CacheSpec lists them (Glm5NextArchitecture::cache_spec):
//   KDA: entry 0, one slot per sequence (SequenceStep::state_slot), fp32: the recurrent state [H, dk, dv], then
//        the short conv's last kernel − 1 inputs [kernel − 1, 3·H·dk]; a step starting at position 0 zeroes them.
//   DSA: entry 0 the 512-wide latent in the recipe's KvLayout (no rope part); layers with their own indexer also
//        entry 1, the indexer's rows [k (index_head_dim) | compress-gate score (index_head_dim)] fp32 per token,
//        and entry 2, the pool keys the CUDA runner keeps (this model recomputes them from entry 1).
//   Next-n (MTP) layer i: cache layer num_hidden_layers + i, with the entries of its kind as above (KDA: state in
//   the sequence's state slot; DSA: rows in the sequence's pages).
#pragma once

#include <span>
#include <vector>

#include "kiln/collective.h"
#include "model/arch/glm5_next/glm5_next_config.h"
#include "model/arch/glm5_next/glm5_next_weights.h"
#include "model/decode_context_shard.h"
#include "model/model_step.h"

namespace kiln {
struct SplitContext;
}

namespace kiln::glm5_next {

class Glm5NextModel {
 public:
  Glm5NextModel(Glm5NextConfig config, Glm5NextWeights weights)
      : config_(std::move(config)), weights_(std::move(weights)) {}

  const Glm5NextConfig& config() const { return config_; }
  // fp32 (the reference against transformers) or the CUDA runner's rounding (Precision::kBf16: weights as loaded
  // by load_glm5_next_weights in bf16, activations rounded to bf16 wherever the GPU stores them in bf16 — the
  // points are marked round_bf16 in this model's files). Must match the precision the weights were loaded with.
  void set_precision(Precision p) { precision_ = p; }
  bool bf16() const { return precision_ == Precision::kBf16; }
  // CPU threads for this model's kernels (0 = OpenMP's default), applied on the thread that runs each forward.
  void set_threads(int threads) { threads_ = threads; }
  // Tensor parallelism, the family's way (MlaMoeModel::set_collective): the group this rank's weights
  // (Glm5NextWeights::shard) are a part of. Each rank computes its DSA and KDA heads, intermediate columns, routed
  // experts and vocabulary rows; the parts meet through gathers that copy, never partial sums: a rank gathers the
  // heads' outputs and the MLPs' SwiGLU activations and runs o_proj / down_proj whole, routed experts' pair outputs
  // come from their one owner (zeros elsewhere) and are summed in slot order, embeddings and logits are gathered.
  // Replicated work (the mHC maps, norms, the router, q_a / kv_a, the DSA indexer and so its top-k) is the same
  // arithmetic on every rank. So every rank computes every value as one rank does: output bit-identical to
  // parallel.tensor = 1. KV pages shared by the ranks (threads of one process) are written by rank 0 alone, and the
  // ranks meet before reading them; a KDA state slot holds every head, and each rank reads and writes only its own
  // heads' parts of it (recurrent and conv state), so a slot is the whole state whatever the rank count.
  void set_collective(Collective* collective) { collective_ = collective; }
  // One process per rank: this rank's KV pages and state slots are its own, so it writes every row it reads.
  void set_private_cache(bool on) { private_cache_ = on; }
  // Decode-context parallelism, the family's way (MlaMoeModel::set_decode_context): this rank's group of D
  // consecutive tensor-parallel ranks splits the DSA layers' paged caches by token (decode_context_shard.h) — the
  // latents and the indexer's rows; a rank writes only its own tokens'. A DSA layer's absorbed attention gathers
  // the group's queries, attends over each rank's own (selected) tokens and merges by log-sum-exp in rank order
  // (logits agree with one rank to fp32 rounding, not bit for bit); the pooled indexer gathers the rows its complete
  // pools are made of, so every rank computes one rank's pool keys, scores and selection exactly. KDA state is per
  // sequence, not per token: it stays whole in each sequence's slot, each rank advancing its own heads' part.
  void set_decode_context(Collective* group, DecodeContextShard shard) {
    context_group_ = group;
    context_shard_ = shard;
  }

  // Runs all steps as one batch: updates their caches and state slots, and returns the logits rows they ask for
  // (out.logits / out.first_row), the final-normed hidden state of every token with want_hidden (out.hidden), the
  // tapped layers' outputs (out.taps, views into tap_storage_: layer i's the mean of its hyper-connection streams,
  // kTapFinalNormed's the final-normed rows), and with record_router_margin each token's smallest MoE routing margin.
  Status forward(std::span<const SequenceStep> steps, const CacheViews& caches, const StepOptions& options,
                 StepOutput& out) const;
  // Next-n layer `mtp_index` (weights().mtp) over steps whose token i is t_{p+1} for position p = start_position + i,
  // row i of prev_hidden [tokens, hidden] the hidden state it conditions on (the trunk's final-normed output, or
  // this layer's own for recursive drafts). Logits come from shared_head.norm → shared_head.head (or lm_head);
  // out.hidden is the layer's output before that norm (the mean of its streams with hyper-connections).
  // A KDA-kind layer advances the steps' state slots, as a trunk KDA layer does.
  Status mtp_forward(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                     const CacheViews& caches, StepOutput& out) const;
  const Glm5NextWeights& weights() const { return weights_; }
  // Sharded, a collective call: every rank of the group must make it.
  Status embed(const int32_t* ids, int64_t n, float* out) const;
  // Logits [n, vocab] of final-normed rows [n, hidden].
  Status lm_head(const float* normed, int64_t n, float* logits) const;

  // The step's tokens flattened, grouped by sequence.
  struct TokenLayout {
    std::vector<int64_t> positions, slots;  // per token: position and paged-cache slot
    std::vector<int64_t> seq_begin;         // [steps + 1] token offsets
    std::vector<const SequenceStep*> steps;
  };

 private:
  // `state`: the layers run keep KDA state, so every step needs a state slot.
  Status make_layout(std::span<const SequenceStep> steps, const CacheViews& caches, bool state, TokenLayout& tl) const;
  // One decoder layer whose caches are layer `l` of `caches`, in place over x: the streams [N, hc_mult, hidden]
  // with hyper-connections, else the residual [N, hidden].
  Status run_layer(const LayerWeights& w, int64_t l, const TokenLayout& tl, const CacheViews& caches, float* x,
                   std::vector<int32_t>& selected, float* router_margin) const;
  // Logits of the rows the steps ask for (the last of each, or all) of the final-normed `normed` [N, hidden].
  Status logits(const TokenLayout& tl, const float* normed, const Linear& head, StepOutput& out) const;
  Status kda(const KdaWeights& w, int64_t l, const TokenLayout& tl, const CacheViews& caches, const float* h,
             float* out) const;
  Status dsa(const DsaWeights& w, int64_t l, const TokenLayout& tl, const CacheViews& caches, const float* h,
             float* out, std::vector<int32_t>& selected) const;
  Status indexer_select(const PooledIndexerWeights& w, int64_t l, const TokenLayout& tl, const CacheViews& caches,
                        const float* h, const float* q_resid, std::vector<int32_t>& selected) const;
  Status mlp(const LayerWeights& w, const float* h, int64_t n, float* out, float* router_margin) const;
  // folded: the shared expert as the GPU folds it into the routed launches (gpu_folds_shared_expert).
  Status dense_mlp(const MlpWeights& m, const float* h, int64_t n, float* out, bool folded = false) const;
  void round_bf16(float* x, int64_t n) const;
  Status routed_experts(const MoeWeights& moe, const float* h, int64_t n, const int32_t* ids, const float* route,
                        float* out) const;

  // The last forward's tapped layer outputs ([taps, N, hidden]: StepOutput::taps point here until the next step).
  mutable std::vector<float> tap_storage_;

  bool sharded() const { return collective_ && weights_.shard.sharded(); }
  // Only one rank writes each KV / indexer row the ranks share: rank 0 (every rank unsharded or with its own pages);
  // with decode-context parallelism the first group's ranks, each its own tokens' (the later groups' ranks own the
  // same tokens and read the same pages).
  bool writes_kv() const {
    if (!sharded() || private_cache_) return true;
    return context_split() ? weights_.shard.rank < context_shard_.world : weights_.shard.rank == 0;
  }
  bool context_split() const { return context_group_ && context_shard_.split(); }
  SplitContext split_context() const;
  // Rows [ctx, 2 · index_head_dim] of a sequence's first ctx positions from the indexer's row cache `rows` (pages of
  // `page` rows): read in place, or with the cache split by token each rank's own, gathered.
  Status indexer_rows(const SequenceStep& st, int64_t ctx, const float* cache, int64_t page, float* rows) const;
  // The group meets: rank 0's cache writes are done before any rank reads them (nothing unsharded or private).
  Status sync_ranks() const;
  // full [n, units · width] from every rank's local [n, (its units) · width] in unit order (a copy unsharded).
  Status gather_units(const float* local, int64_t n, int64_t units, int64_t width, float* full) const;
  // Logits [n, vocab] of a vocabulary-parallel head (this rank's rows, gathered).
  Status head_logits(const Linear& head, const float* normed, int64_t n, float* logits) const;

  Glm5NextConfig config_;
  Glm5NextWeights weights_;
  int threads_ = 0;
  Precision precision_ = Precision::kFp32;
  Collective* collective_ = nullptr;
  bool private_cache_ = false;
  Collective* context_group_ = nullptr;
  DecodeContextShard context_shard_;
};

}  // namespace kiln::glm5_next
