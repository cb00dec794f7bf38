// Drafter: proposes K tokens per sequence for the target to verify in one pass (speculative decoding).
// The capability descriptor tells the engine what the drafter needs from the target and what it returns.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

struct DrafterCapabilities {
  std::vector<int> target_hidden_layers;  // target layers whose output hidden states it consumes (-1 = last)
  int max_depth = 0;                      // largest K it can propose (0 = does not draft)
  bool parallel_drafting = false;         // all K in one pass (DFlash) vs one per step (MTP)
  bool has_draft_probs = false;           // returns q(x) for lossless rejection sampling at T > 0
  bool needs_kv_rollback = false;         // keeps its own KV that must follow the accepted length
};

// One sequence's input to a drafting step: the tokens verified since its last step and the target's
// hidden states at those positions (layers as requested in the capabilities, concatenated).
struct DraftInput {
  int64_t seq_id = 0;
  int64_t start_position = 0;          // position of tokens[0]
  const int32_t* tokens = nullptr;
  int64_t num_tokens = 0;
  const float* target_hidden = nullptr;  // [num_tokens, hidden · layers]
};

struct DraftOutput {
  std::vector<int32_t> tokens;  // depth tokens
  std::vector<float> probs;     // depth × vocab draft distribution when has_draft_probs
};

class Drafter {
 public:
  static constexpr PluginKind kKind = PluginKind::kDrafter;
  virtual ~Drafter() = default;
  virtual DrafterCapabilities capabilities() const = 0;
  virtual Status propose(const std::vector<DraftInput>& batch, int depth, std::vector<DraftOutput>& out) = 0;
  // The target accepted tokens up to `length` (exclusive) for this sequence: discard drafter state beyond it.
  virtual Status rollback(int64_t seq_id, int64_t length) = 0;
  virtual void release(int64_t seq_id) = 0;
};

}  // namespace kiln
