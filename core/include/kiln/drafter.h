// Drafter: proposes K tokens per sequence for the target to verify in one pass (speculative decoding).
// The capability descriptor tells the engine what the drafter needs from the target and what it returns.
//
// The step contract, for one sequence. The target's KV holds positions 0 .. L−1 and the sequence's newest
// token t_L (sampled, not yet run by the target) is known. A drafting step passes the rows the target ran
// since the previous step (positions start_position .. L−1, their tokens and hidden states) plus t_L as
// `next_token`; the drafter returns drafts of t_{L+1} .. t_{L+K}. The target then runs t_L and the drafts
// at positions L .. L+K, accepts a prefix and calls rollback(seq, L') with the new accepted length L'.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

struct DrafterCapabilities {
  // Target layers whose output hidden states it consumes; -1 = the last layer's output after the final
  // norm (what an MTP layer conditions on).
  std::vector<int> target_hidden_layers;
  int max_depth = 0;                      // largest K it can propose (0 = does not draft)
  bool parallel_drafting = false;         // all K in one pass (DFlash) vs one per step (MTP)
  bool has_draft_probs = false;           // returns q(x) for lossless rejection sampling at T > 0
  bool needs_kv_rollback = false;         // keeps its own KV that must follow the accepted length
};

// One sequence's input to a drafting step (see the contract above).
struct DraftInput {
  int64_t seq_id = 0;
  int64_t start_position = 0;            // position of tokens[0]
  const int32_t* tokens = nullptr;       // tokens the target ran at positions start_position .. + num_tokens − 1
  int64_t num_tokens = 0;
  const float* target_hidden = nullptr;  // [num_tokens, hidden · layers], layers as in the capabilities
  // Since ABI 1.1:
  int32_t next_token = -1;               // t_L: the newest token, at position start_position + num_tokens
  // ≤ 0: greedy drafts (argmax; probs stay empty). > 0: drafts are sampled from q = softmax(logits / T) and,
  // when has_draft_probs, q is returned so the target can verify by rejection sampling.
  float temperature = 0.0f;
  uint64_t seed = 0;                     // seeds the sequence's draft sampling when the drafter first sees it
};

struct DraftOutput {
  std::vector<int32_t> tokens;  // depth tokens
  std::vector<float> probs;     // depth × vocab draft distribution when has_draft_probs and temperature > 0
};

// Since ABI 1.1. Services the engine lends to drafters: the target checkpoint's own next-n (MTP) layers, run
// by the core with their own paged KV per drafter sequence (dtype from `speculative.draft_kv_dtype`). Passed in
// CreateContext::draft_host; it outlives every drafter created with it. Not thread-safe: one call at a time.
struct DraftLayerRows {
  int64_t seq_id = 0;
  // Draft-layer position of row 0. Must not exceed the sequence's current length (no gaps); rows from here on
  // are (over)written and the length becomes start_position + num_rows.
  int64_t start_position = 0;
  // Row i at position p = start_position + i drafts t_{p+2} from tokens[i] = t_{p+1} and hidden row i
  // (the target's final-normed hidden state h_p, or the draft layer's own output for recursive steps).
  const int32_t* tokens = nullptr;
  const float* hidden = nullptr;  // [num_rows, hidden_size]
  int64_t num_rows = 0;
  bool all_logits = false;        // logits for every row, or only the last
};

struct DraftLayerOutput {
  std::vector<float> logits;       // [rows with logits, vocab]
  std::vector<int64_t> first_row;  // per batch entry, its first row in `logits`
  std::vector<float> hidden;       // [Σ num_rows, hidden_size]: the layer's output (before its head norm)
};

class DraftHost {
 public:
  virtual ~DraftHost() = default;
  virtual int64_t num_draft_layers() const = 0;  // next-n layers the checkpoint provides (0 = none)
  virtual int64_t hidden_size() const = 0;
  virtual int64_t vocab_size() const = 0;
  // A drafter sequence with empty KV. Fails if `seq_id` already exists.
  virtual Status allocate(int64_t seq_id) = 0;
  // Runs draft layer `layer` over the batch (one entry per sequence, each at most once), writing its KV.
  virtual Status run(int64_t layer, const std::vector<DraftLayerRows>& batch, DraftLayerOutput& out) = 0;
  // Positions the sequence's KV holds.
  virtual Result<int64_t> length(int64_t seq_id) const = 0;
  // Drops KV positions ≥ `length` (a no-op when it holds fewer); freed pages return to the pool.
  virtual Status truncate(int64_t seq_id, int64_t length) = 0;
  virtual void release(int64_t seq_id) = 0;
};

class Drafter {
 public:
  static constexpr PluginKind kKind = PluginKind::kDrafter;
  virtual ~Drafter() = default;
  virtual DrafterCapabilities capabilities() const = 0;
  // out[b] holds batch[b]'s drafts: `depth` tokens (≤ max_depth), fewer when the drafter has none to offer.
  virtual Status propose(const std::vector<DraftInput>& batch, int depth, std::vector<DraftOutput>& out) = 0;
  // The target's KV now holds positions < `length` for this sequence: discard drafter state beyond it.
  virtual Status rollback(int64_t seq_id, int64_t length) = 0;
  virtual void release(int64_t seq_id) = 0;
};

}  // namespace kiln
