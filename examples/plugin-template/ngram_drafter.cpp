// Example third-party plugin: a prompt-lookup ("n-gram") drafter. It proposes the tokens that followed the
// most recent earlier occurrence of the sequence's last `ngram_size` tokens — useful for code edits and
// quoting, and needing no model. It includes only SDK headers, like every plugin must.
#include <algorithm>
#include <map>
#include <vector>

#include "example_plugin.h"

namespace example_plugin {
namespace {

class NgramDrafter final : public kiln::Drafter {
 public:
  explicit NgramDrafter(int ngram_size) : n_(ngram_size) {}

  kiln::DrafterCapabilities capabilities() const override {
    kiln::DrafterCapabilities caps;
    caps.max_depth = 16;
    caps.parallel_drafting = true;  // all K tokens come from one lookup
    return caps;
  }

  // history[p] = the sequence's token at position p (−1 where it never saw one: position 0, or a cached prefix).
  kiln::Status propose(const kiln::DraftStep& step, std::vector<kiln::DraftProposal>& out) override {
    out.assign(step.seqs.size(), {});
    for (size_t b = 0; b < step.seqs.size(); ++b) {
      const kiln::DraftSequence& s = step.seqs[b];
      auto& history = history_[s.seq_id];
      // Row p brings the token at p + 1; rows from start_position on replace what it held there.
      const size_t end = static_cast<size_t>(s.start_position + s.num_rows + 1);
      history.resize(std::max(history.size(), end), -1);
      history.resize(end);
      std::copy(s.next_tokens, s.next_tokens + s.num_rows, history.begin() + s.start_position + 1);
      if (s.depth > 0) out[b].tokens = lookup(history, s.depth);
    }
    return {};
  }

  kiln::Status rollback(int64_t seq_id, int64_t length) override {
    auto& h = history_[seq_id];
    if (length + 1 < static_cast<int64_t>(h.size())) h.resize(static_cast<size_t>(length + 1));
    return {};
  }

  void release(int64_t seq_id) override { history_.erase(seq_id); }

 private:
  // Tokens following the latest earlier match of the last n tokens; fewer than depth (or none) if no match.
  std::vector<int32_t> lookup(const std::vector<int32_t>& h, int depth) const {
    const int64_t len = static_cast<int64_t>(h.size());
    if (len <= n_) return {};
    for (int64_t start = len - n_ - 1; start >= 0; --start) {
      if (!std::equal(h.begin() + start, h.begin() + start + n_, h.end() - n_)) continue;
      if (std::find(h.begin() + start, h.begin() + start + n_, -1) != h.begin() + start + n_) continue;
      int64_t from = start + n_;
      int64_t to = std::min<int64_t>(from + depth, len);
      return {h.begin() + from, h.begin() + to};
    }
    return {};
  }

  int n_;
  std::map<int64_t, std::vector<int32_t>> history_;
};

}  // namespace

kiln::Result<std::unique_ptr<kiln::Drafter>> make_ngram_drafter(const kiln::CreateContext& ctx) {
  int64_t n = ctx.section ? ctx.section->get_int("ngram_size", 3) : 3;
  return std::unique_ptr<kiln::Drafter>(new NgramDrafter(static_cast<int>(n)));
}

kiln::SectionSchema ngram_drafter_schema() {
  kiln::KeySpec ngram;
  ngram.name = "ngram_size";
  ngram.type = kiln::ValueType::kInteger;
  ngram.default_value = int64_t{3};
  ngram.min = 1;
  ngram.max = 64;
  ngram.doc = "tokens matched to find a continuation";
  return {{ngram}};
}

}  // namespace example_plugin
