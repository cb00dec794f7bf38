// Drafter: proposes K tokens per sequence for the target to verify in one pass (speculative decoding).
//
// The step contract. After every target step the engine calls propose() with the rows that step computed for
// each sequence the drafter follows: their positions, the token after each row (the last one is the token the
// step just sampled, t_L, which the target has not run yet), and the target's hidden states at the layers the
// drafter taps (device tensors, valid during the call). The drafter extends its own state over those rows and,
// where `depth` > 0, proposes drafts of t_{L+1} .. t_{L+depth}. The next target step runs t_L and the drafts at
// positions L .. L + depth, verifies them on the device against `q` (sparse draft probabilities, on the device)
// and accepts a prefix; the rows it then calls propose() with start where the accepted ones do, so rows a drafter
// computed past them are simply recomputed (rollback() also tells it the target's new length). When the target
// took a cached prefix, a sequence's first rows start past position 0: the drafter has no rows for the prefix (its
// caches there hold whatever the sequence that computed the prefix left), which can only cost acceptance, never
// correctness: verification is lossless whatever the drafts are.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/cache_spec.h"
#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

// Target layers a drafter can tap: i ≥ 0 = the residual stream after decoder layer i (fp32, before any norm);
// kTapFinalNormed = the last layer's output after the final norm (what an MTP layer conditions on).
inline constexpr int kTapFinalNormed = -1;

struct DrafterCapabilities {
  std::vector<int> tap_layers;            // in the order DraftStep::taps lists them
  int max_depth = 0;                      // largest K it can propose (0 = does not draft)
  bool parallel_drafting = false;         // all K in one pass (DFlash) vs one per step (MTP)
  bool has_draft_probs = false;           // returns q for lossless rejection sampling at T > 0
  bool needs_kv_rollback = false;         // keeps its own KV that must follow the accepted length
  bool needs_target_mtp = false;          // runs the target checkpoint's next-n layers (DraftServices::mtp_run)
  bool needs_draft_model = false;         // loads a checkpoint of its own (speculative.draft_model)
  // Paged caches of the drafter's own layers (e.g. its context K/V): the engine's CacheManager allocates them beside
  // the target's, paged by the same block tables (DraftServices::cache), and counts them in the capacity report.
  std::vector<LayerCacheSpec> cache_layers;
};

// One sequence in a propose() call.
struct DraftSequence {
  int64_t seq_id = 0;
  int64_t start_position = 0;          // position of its first new row (≤ the drafter's current length)
  int64_t num_rows = 0;                // ≥ 1 new target rows: positions start_position .. + num_rows − 1
  int64_t tap_row = 0;                 // the first of them in DraftStep::taps
  const int32_t* next_tokens = nullptr;  // host [num_rows]: row i's following token t_{p+1}; the last is t_L
  int depth = 0;                       // drafts wanted after t_L (0: only follow the rows)
  // ≤ 0: greedy drafts (argmax, no q). > 0: drafts drawn from q, returned for rejection sampling.
  float temperature = 0.0f;
  uint64_t seed = 0;                   // seeds the sequence's draft sampling when the drafter first sees it
  // The sequence's block table (host): page ids of its positions in the target's pool, which the drafter's own
  // caches and the target's next-n layers share. Covers the drafts' positions too.
  const int32_t* block_table = nullptr;
  int64_t num_blocks = 0;
};

struct DraftStep {
  std::vector<DraftSequence> seqs;
  // Per tap layer (capabilities order): [rows of the target step, hidden_size] fp32 on the drafter's device.
  std::vector<TensorView> taps;
};

struct DraftProposal {
  std::vector<int32_t> tokens;  // host: at most `depth` drafts (fewer, or none, when it has nothing to offer)
  // Sparse q on the drafter's device, [tokens.size(), q_width]: candidate ids (−1 unused) and probabilities;
  // q(x) = 0 for ids not listed. Null with greedy drafts (q is one-hot at the draft). Valid until the next call.
  const int32_t* q_ids = nullptr;
  const float* q_probs = nullptr;
  int64_t q_width = 0;
};

class Drafter {
 public:
  static constexpr PluginKind kKind = PluginKind::kDrafter;
  virtual ~Drafter() = default;
  virtual DrafterCapabilities capabilities() const = 0;
  // out[b] answers step.seqs[b].
  virtual Status propose(const DraftStep& step, std::vector<DraftProposal>& out) = 0;
  // The target's KV now holds positions < `length` for this sequence: discard drafter state beyond it.
  virtual Status rollback(int64_t seq_id, int64_t length) = 0;
  virtual void release(int64_t seq_id) = 0;
};

}  // namespace kiln
