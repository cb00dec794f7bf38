// What one step of a model takes and gives, on any device: per sequence the new tokens with their positions and
// pages (SequenceStep), what to select from its logits afterwards (TokenSelection: plain sampling, or verification
// of drafts), and the cache memory the step reads and writes (CacheViews, from the CacheManager).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/kv_layout.h"
#include "kiln/tensor.h"
#include "model/logit_adjustment.h"

namespace kiln {

// Media rows a step's tokens take instead of their embeddings (the modality path's embedding override).
struct MediaRows {
  int64_t first_row = 0;            // relative to the step's tokens
  int64_t count = 0;
  const float* embeddings = nullptr;  // host [count, hidden] fp32
};

// New tokens of one sequence: positions start_position .. start_position + tokens.size() − 1.
struct SequenceStep {
  std::span<const int32_t> tokens;
  int64_t start_position = 0;
  const std::vector<int32_t>* block_table = nullptr;  // must cover start_position + tokens.size() positions
  bool all_logits = false;                            // logits for every new token, not only the last
  int32_t state_slot = -1;                            // the sequence's state slot (models with recurrent state)
  std::span<const MediaRows> media;                   // embedding overrides inside this step's tokens
  // On the model's device, tokens.size() ids that replace the values of `tokens` (which then only counts them): a
  // drafter's chained step feeds the draft it just sampled without waiting for it on the host. CUDA models only.
  const int32_t* device_tokens = nullptr;
  // The sequence's whole prompt, in tokens (−1: not known). The CPU's DSA indexers rank a query's keys as
  // transformers does on its one-shot prompt and then token by token: over a row of max(prompt_length, position + 1)
  // keys, those after the query masked. torch's top-k picks among exactly tied scores by the row's length, so a row
  // of this length keeps the same keys whether the prompt came in one step, in chunks, over a cached prefix, or the
  // tokens in a verification pass. −1: the step's own keys (start_position + tokens.size()).
  int64_t prompt_length = -1;
};

// What a step picks from one sequence's logits after the forward (on the model's device: only ids come back).
struct TokenSelection {
  bool select = false;  // false: nothing (a prompt chunk with more to come)
  float temperature = 0.0f;  // ≤ 0: greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  // > 0: the step's tokens are [t_L, d_1 .. d_K] (all_logits set) and the K drafts are verified against the
  // target's rows; the result is the accepted prefix plus the correction or bonus token.
  int32_t num_drafts = 0;
  std::span<const int32_t> drafts;  // host: the K drafts (the step's tokens 1..K)
  // Sparse draft distribution, on the model's device ([K, q_width]); null: greedy drafts (one-hot q).
  const int32_t* q_ids = nullptr;
  const float* q_probs = nullptr;
  int64_t q_width = 0;
  // K + 1 uniforms in [0, 1) from the request's seeded generator: one per draft's acceptance test, then one for
  // the sampled token (unused when greedy).
  std::vector<double> uniforms;
  // ≥ 0: report each selected token's log-probability and this many most likely alternatives (StepOutput::logprobs).
  int32_t logprobs = -1;
  // Constrained decoding (engine/token_constraint.h): empty, or num_drafts + 1 host bitmask rows of
  // token_mask_words(vocab) words, row t the tokens allowed at the step's row t (bit v % 32 of word v / 32). Tokens
  // outside it are impossible for greedy, sampled and verified selection alike; logprobs stay the model's own.
  std::span<const uint32_t> allowed;
  // Sampling penalties and logit_bias: empty, or row t's adjustments are adjustments[adjustment_offsets[t] ..
  // adjustment_offsets[t + 1]) (num_drafts + 2 offsets): like the masks, row t's are what the request's history
  // would give after the drafts before it, so verified output equals undrafted output. Applied before the masks;
  // logprobs stay the model's own. A row's tokens are distinct (the CUDA selection refuses repeats; the engine's
  // rows come out of a map, ascending).
  std::span<const LogitAdjustment> adjustments;
  std::span<const int32_t> adjustment_offsets;
  // > 0 (sampled rows only): tokens whose probability after temperature is below min_p × the likeliest token's are
  // impossible — applied after the adjustments and masks, before top-k and top-p (as vLLM orders them).
  float min_p = 0.0f;
};

inline int64_t token_mask_words(int64_t vocab) { return (vocab + 31) / 32; }
inline bool token_allowed(const uint32_t* row, int32_t token) { return (row[token >> 5] >> (token & 31)) & 1u; }

// A selected token's log-probability under the model's distribution (log-softmax of its logits row, before
// temperature, top-k and top-p), and the most likely tokens of that row, best first.
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

// Cache memory by layer: entries in the order the layer's CacheSpec lists them. Paged entries are
// [num_blocks · block_size, bytes per token] (slot = block · block_size + offset), state entries
// [state slots, slot bytes]. On the model's device.
struct CacheViews {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  const KvLayout* layout = nullptr;       // kMlaLatent entries are in its format
  std::vector<std::vector<void*>> layers;  // [layer][entry]; a layer without caches here has none
  // [layer][entry]: the bytes behind each pointer of `layers` (state entries: their slots and snapshots), so that a
  // rank in another process can hold a pool of the same geometry (parallel/rank_processes.h).
  std::vector<std::vector<size_t>> bytes;
  void* entry(int64_t layer, size_t i) const {
    if (layer < 0 || layer >= static_cast<int64_t>(layers.size()) || i >= layers[layer].size()) return nullptr;
    return layers[layer][i];
  }
};

// A pool's identity across processes: the address of its first entry (a rank in another process mirrors each pool
// of rank 0 once, keyed by it).
inline const void* pool_identity(const CacheViews& c) {
  for (const auto& layer : c.layers)
    for (void* p : layer)
      if (p) return p;
  return nullptr;
}

// One copy the cache owner made inside a pool's state entry (a state slot to its snapshot, or back), in bytes from
// the entry's start. A model whose ranks hold pools of their own repeats it there (ModelInstance::mirror_state_copy).
struct StateCopy {
  const void* pool = nullptr;  // pool_identity of the pool
  int64_t layer = 0;
  size_t entry = 0;
  size_t from = 0, to = 0, bytes = 0;
};

// slot = block · block_size + offset: where position `pos` of a sequence with `table` lives.
inline int64_t kv_slot(const std::vector<int32_t>& table, int64_t block_size, int64_t pos) {
  return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
}

struct StepOptions {
  bool want_logits = false;  // copy the logits rows to the host (tests, reference comparisons)
  bool want_hidden = false;  // copy the final-normed hidden states of every token to the host (tests)
  // Target layers whose outputs the drafter taps (kiln/drafter.h numbering); left on the device in `taps`.
  std::vector<int> tap_layers;
  bool record_router_margin = false;  // CPU reference only: the smallest MoE routing margin per token
};

struct StepOutput {
  // Per step entry: accepted drafts then the selected token (empty where nothing was selected), and how many of
  // them are accepted drafts.
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> accepted;
  // Per step entry whose selection asked for logprobs, one per token in `tokens` (from the row that selected it: a
  // verified draft's or the bonus token's own target row); empty otherwise, and on runners that do not report them.
  std::vector<std::vector<TokenLogprobs>> logprobs;
  // With want_logits: [rows, vocab] on the host, and per entry its first row.
  std::vector<float> logits;
  std::vector<int64_t> first_row;
  // With want_hidden: [tokens, hidden] on the host. Of an MTP step: the layer's output before its head norm.
  std::vector<float> hidden;
  // Per tap layer: [tokens of the step, hidden] fp32 on the model's device, valid until its next step.
  std::vector<TensorView> taps;
  std::vector<float> router_margin;  // with record_router_margin
};

}  // namespace kiln
