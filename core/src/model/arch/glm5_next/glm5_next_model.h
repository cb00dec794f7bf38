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

#include "model/arch/glm5_next/glm5_next_config.h"
#include "model/arch/glm5_next/glm5_next_weights.h"
#include "model/model_step.h"

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

  // Runs all steps as one batch: updates their caches and state slots, and returns the logits rows they ask for
  // (out.logits / out.first_row), the final-normed hidden state of every token with want_hidden or a
  // kTapFinalNormed tap (out.taps views into out.hidden; no other tap is offered), and with
  // record_router_margin each token's smallest MoE routing margin.
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
  void embed(const int32_t* ids, int64_t n, float* out) const;
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
  Status dense_mlp(const MlpWeights& m, const float* h, int64_t n, float* out) const;
  void round_bf16(float* x, int64_t n) const;

  Glm5NextConfig config_;
  Glm5NextWeights weights_;
  int threads_ = 0;
  Precision precision_ = Precision::kFp32;
};

}  // namespace kiln::glm5_next
