#include "oracle_drafter.h"

#include <string>
#include <utility>

namespace kiln::cli {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

double expected_tokens_per_pass(const std::vector<double>& profile) {
  double total = 1, reach = 1;
  for (double p : profile) total += (reach *= p);
  return total;
}

OracleDrafter::OracleDrafter(std::vector<double> profile, std::vector<std::vector<int32_t>> recordings,
                             int64_t vocab_size, uint64_t seed)
    : profile_(std::move(profile)), recordings_(std::move(recordings)), vocab_(vocab_size), seed_(seed) {
  stats_.reached.assign(profile_.size(), 0);
  stats_.accepted.assign(profile_.size(), 0);
}

DrafterCapabilities OracleDrafter::capabilities() const {
  DrafterCapabilities c;
  c.max_depth = static_cast<int>(profile_.size());
  return c;  // no taps, no caches, no q: it reads nothing of the target
}

bool OracleDrafter::draft_is_correct(size_t recording, int64_t anchor, int i) const {
  uint64_t x = splitmix64(seed_ ^ splitmix64(recording));
  x = splitmix64(x ^ static_cast<uint64_t>(anchor));
  x = splitmix64(x ^ static_cast<uint64_t>(i));
  const double u = static_cast<double>(x >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  return u < profile_[static_cast<size_t>(i) - 1];
}

Result<size_t> OracleDrafter::match_recording(const DraftSequence& d) const {
  // The recording whose tokens agree longest with the rows (a run that left its recording early still finds it;
  // the rows past the agreement count as divergent).
  size_t best = recordings_.size();
  int64_t best_agree = 0;
  for (size_t r = 0; r < recordings_.size(); ++r) {
    const std::vector<int32_t>& rec = recordings_[r];
    int64_t agree = 0;
    while (agree < d.num_rows && d.start_position + agree + 1 < static_cast<int64_t>(rec.size()) &&
           rec[d.start_position + agree + 1] == d.next_tokens[agree])
      ++agree;
    if (agree > best_agree) best = r, best_agree = agree;
  }
  if (best == recordings_.size())
    return not_found("the oracle drafter has no recording of sequence " + std::to_string(d.seq_id) +
                     " (its rows from position " + std::to_string(d.start_position) +
                     " match none of the plain run's sequences)");
  return best;
}

Status OracleDrafter::propose(const DraftStep& step, std::vector<DraftProposal>& out) {
  out.assign(step.seqs.size(), {});
  for (size_t b = 0; b < step.seqs.size(); ++b) {
    const DraftSequence& d = step.seqs[b];
    auto it = seqs_.find(d.seq_id);
    if (it == seqs_.end()) {
      KILN_ASSIGN_OR_RETURN(size_t r, match_recording(d));
      it = seqs_.emplace(d.seq_id, Followed{r, {}}).first;
    }
    Followed& f = it->second;
    const std::vector<int32_t>& rec = recordings_[f.recording];
    const int64_t known = static_cast<int64_t>(rec.size());
    for (int64_t i = 0; i < d.num_rows; ++i) {
      const int64_t p = d.start_position + i + 1;
      if (p < known && rec[p] != d.next_tokens[i]) ++stats_.divergent_rows;
    }
    // The rows of a pass that followed a proposal start at its anchor: one row per accepted draft, plus t_L's.
    Pending& last = f.pending;
    if (last.depth > 0 && d.start_position == last.anchor) {
      const int64_t accepted = d.num_rows - 1;
      ++stats_.passes;
      stats_.accepted_tokens += accepted;
      if (accepted != last.correct_prefix) ++stats_.unexpected_accepts;
      for (int64_t i = 0; i < last.depth && i <= accepted; ++i) {
        ++stats_.reached[i];
        if (i < accepted) ++stats_.accepted[i];
      }
    }
    last = Pending{};
    if (d.depth <= 0) continue;
    if (d.temperature > 0.0f)
      return invalid_argument("the oracle drafter drafts for greedy decoding only (sequence " +
                              std::to_string(d.seq_id) + " samples at temperature " + std::to_string(d.temperature) +
                              ")");
    // Rows cover positions start .. start + rows − 1; the last one's following token t_L sits at L = start + rows.
    const int64_t anchor = d.start_position + d.num_rows;
    DraftProposal& proposal = out[b];
    bool all_correct = true;
    for (int i = 1; i <= d.depth && i <= static_cast<int>(profile_.size()); ++i) {
      const int64_t p = anchor + i;
      if (p >= known) break;  // past the recording: nothing true to offer
      const bool correct = draft_is_correct(f.recording, anchor, i);
      proposal.tokens.push_back(correct ? rec[p] : static_cast<int32_t>((rec[p] + 1) % vocab_));
      if (all_correct && correct) ++last.correct_prefix;
      all_correct = all_correct && correct;
    }
    last.anchor = anchor;
    last.depth = static_cast<int>(proposal.tokens.size());
  }
  return ok_status();
}

Status OracleDrafter::rollback(int64_t, int64_t) { return ok_status(); }  // it keeps no per-position state

void OracleDrafter::release(int64_t seq_id) { seqs_.erase(seq_id); }

}  // namespace kiln::cli
