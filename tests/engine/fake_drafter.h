// A drafter for the fake model (fake_model_runner.h): proposes its greedy continuation, each draft replaced by a
// wrong token at a seeded rate, so passes accept all, some or none of their drafts. Always `depth` drafts.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "fake_model_runner.h"
#include "kiln/drafter.h"

namespace kiln::testing {

class SometimesRightDrafter final : public Drafter {
 public:
  SometimesRightDrafter(int max_depth, int64_t vocab, double wrong_rate = 0.35)
      : max_depth_(max_depth), vocab_(vocab), wrong_rate_(wrong_rate) {}
  DrafterCapabilities capabilities() const override {
    DrafterCapabilities c;
    c.max_depth = max_depth_;
    return c;
  }
  Status propose(const DraftStep& step, std::vector<DraftProposal>& out) override {
    out.assign(step.seqs.size(), {});
    std::vector<float> logits(vocab_);
    for (size_t b = 0; b < step.seqs.size(); ++b) {
      const DraftSequence& d = step.seqs[b];
      // The sequence's tokens by position: row p's successor is next_tokens[p − start]; the last one is t_L.
      std::vector<int32_t>& h = histories_[d.seq_id];
      if (h.empty()) h.push_back(prompt_of_[d.seq_id].at(0));
      h.resize(d.start_position + 1);
      h.insert(h.end(), d.next_tokens, d.next_tokens + d.num_rows);
      std::vector<int32_t> draft_history = h;
      for (int k = 0; k < d.depth; ++k) {
        fake_logits(draft_history, vocab_, logits.data());
        int32_t best = 0;
        for (int32_t v = 1; v < vocab_; ++v)
          if (logits[v] > logits[best]) best = v;
        if (std::uniform_real_distribution<double>(0, 1)(rng_) < wrong_rate_) best = (best + 1) % vocab_;
        out[b].tokens.push_back(best);
        draft_history.push_back(best);
      }
    }
    return ok_status();
  }
  Status rollback(int64_t, int64_t) override { return ok_status(); }
  void release(int64_t id) override { histories_.erase(id); }
  // Sequence ids count from 1 in submission order; the drafter is never shown position 0.
  void set_prompt(int64_t id, std::vector<int32_t> prompt) { prompt_of_[id] = std::move(prompt); }

 private:
  int max_depth_;
  int64_t vocab_;
  double wrong_rate_;
  std::mt19937_64 rng_{5};
  std::map<int64_t, std::vector<int32_t>> histories_, prompt_of_;
};

}  // namespace kiln::testing
