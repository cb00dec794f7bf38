// A benchmark drafter whose acceptance follows a fixed per-position profile, for timing drafting on models whose
// weights give no meaningful acceptance (dummy GLM-4.7-Flash shapes). It is not a recipe choice: `kiln bench decode
// --draft-profile` builds it and hands it to the engine directly.
//
// How it stays honest. Greedy decoding is deterministic and drafting is lossless, so a plain run first records each
// sequence's greedy continuation. In the drafted run the oracle proposes, at draft position i (1-based) of a step,
// the recorded token with probability p_i and a token that is certainly wrong otherwise (the recorded one + 1 mod
// vocab). The engine's real verifier then accepts the prefix up to the first wrong draft, so
//   p_i = P(draft i is correct | drafts 1 .. i − 1 were correct)   (per-position conditional acceptance),
// and the expected tokens a verification pass yields are 1 + Σ_{i=1..K} Π_{j≤i} p_j. Each decision is a hash of
// (seed, sequence, position of the step's anchor token, i): the same run of decisions whatever the batching.
//
// It also checks the verifier: every row the engine reports back is compared with the recording (a difference means
// the drafted run's output left the plain run's), and the length each pass accepted with the length its decisions
// imply.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "kiln/drafter.h"

namespace kiln::cli {

// 1 + Σ_{i} Π_{j≤i} p_j: the mean tokens a verification pass yields under the profile.
double expected_tokens_per_pass(const std::vector<double>& profile);

struct OracleStats {
  // Per draft position i (0-based): passes that proposed draft i after i correct drafts, and how many of those
  // accepted it. accepted[i] / reached[i] estimates profile[i].
  std::vector<int64_t> reached, accepted;
  int64_t passes = 0;            // verification passes whose outcome was seen
  int64_t accepted_tokens = 0;   // drafts accepted over them
  int64_t divergent_rows = 0;    // rows whose token differed from the recording (output left the plain run's)
  int64_t unexpected_accepts = 0;  // passes that accepted another length than the decisions imply
  double conditional_rate(size_t i) const {
    return i < reached.size() && reached[i] ? static_cast<double>(accepted[i]) / reached[i] : 0.0;
  }
};

class OracleDrafter final : public Drafter {
 public:
  // `recordings`: each sequence's tokens, prompt then greedy continuation, as the plain run produced them; a
  // sequence is matched to the recording its first rows agree with longest. Profile values are in [0, 1].
  OracleDrafter(std::vector<double> profile, std::vector<std::vector<int32_t>> recordings, int64_t vocab_size,
                uint64_t seed = 0x6b696c6e);

  DrafterCapabilities capabilities() const override;
  Status propose(const DraftStep& step, std::vector<DraftProposal>& out) override;
  Status rollback(int64_t seq_id, int64_t length) override;
  void release(int64_t seq_id) override;

  // Read after the engine stopped (the engine calls the drafter from its loop thread).
  const OracleStats& stats() const { return stats_; }

 private:
  struct Pending {              // the last proposal, until the engine reports what it accepted
    int64_t anchor = -1;        // position L of the pass's first row (t_L)
    int depth = 0;              // drafts proposed
    int correct_prefix = 0;     // how many leading drafts were the recorded tokens
  };
  struct Followed {
    size_t recording = 0;
    Pending pending;
  };
  Result<size_t> match_recording(const DraftSequence& d) const;
  bool draft_is_correct(size_t recording, int64_t anchor, int i) const;

  std::vector<double> profile_;
  std::vector<std::vector<int32_t>> recordings_;
  int64_t vocab_;
  uint64_t seed_;
  std::map<int64_t, Followed> seqs_;
  OracleStats stats_;
};

}  // namespace kiln::cli
