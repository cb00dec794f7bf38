// The forward pass of the MLA + MoE family (glm4_moe_lite, glm_moe_dsa, deepseek_v3) on the CPU — the reference
// the CUDA runner is tested against: batches of sequences at different positions in one call, KV in paged form
// through the recipe's KvLayout in the CacheManager's memory (CacheViews), linears and experts through the recipe's
// WeightFormat.
//
// Precision (the weights' ModelWeights::precision, recipe key model.precision). fp32: the reference. bf16: the CUDA
// runner's rounding (core/src/runtime/cuda), so that CPU and GPU differ only by fp32 summation order. Activations
// are rounded to bf16 exactly where the GPU stores them in bf16:
//   - every RMSNorm output (input / post-attention norms, q_a_layernorm, the final norm, MTP enorm / hnorm);
//   - the q_a projection's output; q_nope before the absorption (q_pe stays fp32, as the absorbed query's tail);
//   - the latent cache rows (the bf16 KV layout rounds them; use kv.layout = "bf16" as the GPU does);
//   - o_lat before the un-absorption, and the attention output (un-absorbed, or expanded-form prefill);
//   - expanded-form prefill: K_nope / V expanded from the cached (bf16) latents of every position, this step's too;
//   - every projection stored bf16: o_proj, dense gate / up / down (shared expert too), the routed experts' SwiGLU
//     output, and the MoE block output (routed sum + shared expert, summed in fp32, then rounded).
// fp32 as on the GPU: the residual stream, q (q_b / q_proj output, roped), kv_a's output and the latent norm
// before the cache write, attention scores and softmax, the MoE router (fp32 weights, logits, routing weights),
// the routed experts' gate / up before SwiGLU and their down outputs, the DSA indexer (queries, keys, its fp32 key
// cache, scores), the eh_proj output of an MTP layer, logits. Which MLA form a sequence takes follows the GPU too
// (see use_expanded). Not modelled: the tensor-core prefill / decode kernels of the production widths (latent 512,
// rope 64, nope 128 / 192), which also round the attention probabilities to bf16.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "kernels/cpu/moe_router.h"
#include "kernels/cpu/rope.h"
#include "kiln/collective.h"
#include "kiln/indexer_key_format.h"
#include "model/batch_invariance.h"
#include "model/decode_context_shard.h"
#include "model/model_config.h"
#include "model/model_step.h"
#include "model/model_weights.h"

namespace kiln {

struct SplitContext;

// Which MLA form attention runs in. kAuto: in fp32 precision always the absorbed form (attention in latent space
// over the paged cache), so every query row reads the same cached values by the same arithmetic whether its tokens
// came in one chunk or several, with or without a cached prefix: output does not depend on chunking or prefix
// caching. In bf16 precision the GPU's rule (kExpandedPrefillMinTokens). kExpanded (k/v rebuilt from the latents)
// and kAbsorbed force one form (tests compare them).
enum class MlaForm { kAuto, kExpanded, kAbsorbed };

// Why a step cannot run (no tokens, no block table, a table that does not cover its positions, positions past
// the model's limit, token ids outside the vocabulary, media rows outside its tokens), or ok. `index` names the
// step in messages. Shared by the CPU and GPU forward passes so both refuse the same batches with the same words.
Status check_sequence_step(const SequenceStep& step, size_t index, int64_t block_size, const ModelConfig& config);
// The same for any architecture, from its vocabulary size and position limit (0: none).
Status check_sequence_step(const SequenceStep& step, size_t index, int64_t block_size, int64_t vocab_size,
                           int64_t max_position_embeddings);

// The MoE gate's routing rule from the config (one place for the CPU and GPU forward passes).
cpu::MoeRouterConfig moe_router_config(const ModelConfig& config);

class MlaMoeModel {
 public:
  MlaMoeModel(ModelConfig config, ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  void set_mla_form(MlaForm form) { form_ = form; }
  // CPU threads for this model's kernels (0 = OpenMP's default). Applied by every forward call on the thread
  // that makes it, since OpenMP's team size is a per-thread setting and engines run on their own threads.
  void set_threads(int threads) { threads_ = threads; }
  // Tensor parallelism: the group this rank's weights (ModelWeights::shard) are a part of. Every rank runs the same
  // steps; each computes its heads, intermediate columns, routed experts and vocabulary rows, and the parts meet
  // through gathers that copy (never partial sums): a rank gathers the attention heads' outputs and the MLPs'
  // SwiGLU activations and runs o_proj / down_proj whole, routed experts' pair outputs are summed in slot order
  // after each pair came from its one owner, and embeddings and logits are gathered. So every rank computes every
  // value with the same arithmetic as one rank does: output bit-identical to parallel.tensor = 1. Rank 0 alone
  // writes the (shared) KV pages; the ranks meet before reading them. None or one rank: no communication.
  void set_collective(Collective* collective) { collective_ = collective; }
  // Decode-context parallelism: this rank's group of D consecutive tensor-parallel ranks (its end of the group's
  // collective) and its place there. The KV is split by token (decode_context_shard.h): a rank writes and reads only
  // its own tokens' rows. Attention in absorbed form gathers the group's queries (each rank absorbs its own heads),
  // attends every head of the group over its own tokens, and the partial outputs are merged by their log-sum-exp in
  // rank order, each rank keeping its heads (the merge changes fp32 summation order: logits agree with one rank to
  // rounding, not bit for bit). Expanded-form prefill and the DSA indexer's scores gather what they read from the
  // group, so they compute exactly what one rank does (the indexer's top-k is one rank's selection).
  void set_decode_context(Collective* group, DecodeContextShard shard) {
    context_group_ = group;
    context_shard_ = shard;
  }

  // One process per rank: this rank's KV pages are its own (not shared with the other ranks), so it writes every
  // row it reads — all of them, or with decode-context parallelism its own tokens' — and no rank waits for another's
  // writes.
  void set_private_cache(bool on) { private_cache_ = on; }

  // Runs all steps as one batch: writes their KV (and indexer keys) into `caches` and returns the logits rows the
  // steps ask for in out.logits / out.first_row (always: the CPU is the host), the final-normed hidden state of
  // every token with want_hidden, the tapped layers' outputs in out.taps (host views into out's buffers).
  Status forward(std::span<const SequenceStep> steps, const CacheViews& caches, const StepOptions& options,
                 StepOutput& out) const;

  // The next-n (MTP) layer `mtp_index` over the same kind of batch: token i of a step is t_{p+1} for
  // position p = start_position + i, and row i of `prev_hidden` [tokens, hidden] is the hidden state the
  // drafter conditions on for that position. Its KV lives in layer num_hidden_layers + mtp_index of `caches`.
  // Logits come from shared_head.norm → shared_head.head (or the target's lm_head); out.hidden is the layer's
  // output before that norm. With record_router_margin, out.router_margin as a trunk step records it.
  Status mtp_forward(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                     const CacheViews& caches, StepOutput& out, bool record_router_margin = false) const;

  // Embedding rows as fp32 [n, hidden] (every rank of a group calls it together).
  Status embed(const int32_t* ids, int64_t n, float* out) const;
  // Logits [n, vocab] of already-normed rows [n, hidden] through the target's lm_head.
  Status lm_head(const float* normed, int64_t n, float* logits) const;

  // One decoder layer over n tokens already flattened: x is the residual stream [n, hidden], updated in place.
  struct TokenLayout {
    std::vector<int64_t> positions, slots;
    std::vector<int64_t> seq_begin;        // [steps + 1] token offsets
    std::vector<const SequenceStep*> steps;
    std::vector<float> cos, sin;           // [n, rope/2]
  };
  Status run_layer(const LayerWeights& layer, int64_t kv_layer, const TokenLayout& tl, const CacheViews& caches,
                   float* x, std::vector<int32_t>& selected, int64_t& selected_width,
                   float* router_margin = nullptr) const;
  Status make_layout(std::span<const SequenceStep> steps, const CacheViews& caches, TokenLayout& tl) const;

  // DSA: how many query rows so far had their top-k cut inside an exact tie of index scores, where the selection
  // is a convention (cpu::dsa_select_topk) and transformers may legitimately pick other keys.
  int64_t indexer_tied_rows() const { return indexer_tied_rows_->load(std::memory_order_relaxed); }

 private:
  Status attention(const AttentionWeights& w, int64_t kv_layer, const TokenLayout& tl, const CacheViews& caches,
                   const float* h, float* out, std::vector<int32_t>& selected, int64_t& selected_width) const;
  Status indexer_select(const IndexerWeights& w, int64_t kv_layer, const TokenLayout& tl, const CacheViews& caches,
                        const float* h, const float* q_resid, std::vector<int32_t>& selected,
                        int64_t& selected_width) const;
  Status mlp(const LayerWeights& w, const float* h, int64_t n, float* out, float* router_margin) const;
  bool bf16() const { return weights_.precision == Precision::kBf16; }
  // x[0, n) rounded to bf16 in bf16 precision (a GPU rounding point); nothing in fp32.
  void round_bf16(float* x, int64_t n) const;
  bool use_expanded(int64_t new_tokens) const;
  // Decode-context parallelism (mla_decode_context.cpp). Each call is a meeting of the decode-context group.
  bool context_split() const { return context_group_ && context_shard_.split(); }
  SplitContext split_context() const;  // the group, this rank's place in it and its heads (split_context_attention.h)
  // The first `ctx` positions' cached rows [ctx, latent + rope] in position order, each rank's own from its pages.
  Status context_rows(const SequenceStep& st, int64_t ctx, const void* pages, const KvLayout& layout,
                      float* rows) const;
  // Absorbed attention of a sequence's n query rows: qa [n, this rank's heads, latent + rope] → o_lat [n, this rank's
  // heads, latent], over every visible (DSA: selected) position, each rank attending over its own.
  Status context_attend(const SequenceStep& st, int64_t n, const float* qa, const int32_t* selected,
                        int64_t selected_width, float scale, const void* pages, const KvLayout& layout,
                        float* o_lat) const;
  // DSA index scores of a sequence's n queries [n, kv_len] (−inf after each query), each rank scoring its own keys.
  Status context_index_scores(const SequenceStep& st, int64_t n, const float* q, const float* w,
                              const uint8_t* key_cache, IndexerKeyFormat key_format, int64_t page, float scale,
                              float* scores) const;
  // Logits for the rows `steps` ask for, from the rows of `x` [tokens, hidden] through `norm` and `head`.
  Status logits(std::span<const SequenceStep> steps, const TokenLayout& tl, const float* x, const std::vector<float>& norm,
                const Linear& head, StepOutput& out) const;

  ModelConfig config_;
  ModelWeights weights_;
  cpu::RopeConfig rope_;
  std::vector<float> inv_freq_;
  double rope_attention_factor_ = 1.0;
  MlaForm form_ = MlaForm::kAuto;
  int threads_ = 0;
  Collective* collective_ = nullptr;
  bool sharded() const { return collective_ && weights_.shard.sharded(); }
  Collective* context_group_ = nullptr;
  DecodeContextShard context_shard_;
  bool private_cache_ = false;
  // Only one rank writes each KV row the ranks share: rank 0 (every rank when unsharded); with decode-context
  // parallelism the first group's ranks, each its own tokens (the later groups' ranks own the same tokens and read
  // the same pages).
  bool writes_cache() const {
    if (private_cache_) return true;
    return context_split() ? weights_.shard.rank < context_shard_.world : weights_.shard.rank == 0;
  }
  // The group meets: rank 0's cache writes are done before any rank reads them (nothing unsharded).
  Status sync_ranks() const;
  // logits [n, vocab] through a vocabulary-parallel head (this rank's rows, gathered).
  Status head_logits(const Linear& head, const float* normed, int64_t n, float* logits) const;
  // full [n, units · width] from every rank's local [n, (its units) · width] in unit order (a copy unsharded).
  Status gather_units(const float* local, int64_t n, int64_t units, int64_t width, float* full) const;
  // The tapped layers' outputs of the last forward (StepOutput::taps views them until the next one).
  mutable std::vector<float> tap_storage_;
  // DSA rows whose top-k cut fell inside an exact tie of index scores, over this model's life (warned once).
  std::shared_ptr<std::atomic<int64_t>> indexer_tied_rows_ = std::make_shared<std::atomic<int64_t>>(0);
};

// y[n, out] = x[n, in] · Wᵀ through a CPU Linear (fp32 activations).
Status run_linear(const Linear& l, const float* x, int64_t n, float* y);

}  // namespace kiln
