// The CUDA half of the `dflash` / `dflash2` drafters. A propose() call is one DflashCudaModel::run over every
// sequence of the step (their new context rows, then all drafting blocks in one forward), and one synchronisation:
// the copy of the K drafts per sequence to the host. q stays on the device. Uniforms for T > 0 come from each
// sequence's host generator, seeded as the CPU drafter seeds it, so both devices draw alike.
#include "dflash_cuda_drafter.h"

#include <map>
#include <random>
#include <vector>

#include "dflash_cuda_model.h"
#include "dflash_drafter_common.h"

namespace kiln::dflash {
namespace {

class DflashCudaDrafter final : public Drafter {
 public:
  DflashCudaDrafter(DraftServices& services, std::unique_ptr<DflashCudaModel> model, std::string name)
      : s_(services), model_(std::move(model)), name_(std::move(name)) {}

  DrafterCapabilities capabilities() const override {
    return dflash_capabilities(model_->config(), model_->kv_row_bytes());
  }

  Status propose(const DraftStep& step, std::vector<DraftProposal>& out) override {
    out.assign(step.seqs.size(), {});
    if (step.seqs.empty()) return ok_status();
    const DflashConfig& c = model_->config();
    const int64_t bs = s_.block_size();
    rows_.clear();
    blocks_.clear();
    drafting_.clear();
    for (size_t b = 0; b < step.seqs.size(); ++b) {
      const DraftSequence& s = step.seqs[b];
      const std::string who = name_ + " drafter, sequence " + std::to_string(s.seq_id);
      if (s.num_rows < 1 || !s.next_tokens || !s.block_table)
        return invalid_argument(who + ": needs new target rows with their next tokens and a block table");
      if (bs <= 0 || s.num_blocks * bs < s.start_position + s.num_rows)
        return invalid_argument(who + ": the block table covers " + std::to_string(s.num_blocks * bs) +
                                " positions, the context needs " + std::to_string(s.start_position + s.num_rows));
      for (int64_t i = 0; i < s.num_rows; ++i) {
        const int64_t p = s.start_position + i;
        rows_.push_back({static_cast<int32_t>(s.tap_row + i), p, static_cast<int64_t>(s.block_table[p / bs]) * bs + p % bs});
      }
      if (s.depth <= 0) continue;
      if (s.depth > c.block_size - 1)
        return invalid_argument(who + ": depth " + std::to_string(s.depth) + " exceeds block_size − 1 = " +
                                std::to_string(c.block_size - 1) + " of " + c.path);
      DraftBlock k;
      k.anchor = s.next_tokens[s.num_rows - 1];
      if (k.anchor < 0 || k.anchor >= c.vocab)
        return invalid_argument(who + ": token " + std::to_string(k.anchor) + " is not a token id");
      k.anchor_position = s.start_position + s.num_rows;
      k.depth = s.depth;
      k.temperature = s.temperature;
      k.block_table = s.block_table;
      k.num_blocks = s.num_blocks;
      if (s.temperature > 0) {
        auto it = rngs_.find(s.seq_id);
        if (it == rngs_.end()) it = rngs_.emplace(s.seq_id, std::mt19937_64(draft_seed(s.seed))).first;
        for (int t = 0; t < s.depth; ++t) k.uniforms.push_back(draft_uniform(it->second));
      }
      blocks_.push_back(std::move(k));
      drafting_.push_back(b);
    }
    KILN_RETURN_IF_ERROR(model_->run(step.taps, rows_, blocks_).with_context(name_ + " drafter"));
    if (blocks_.empty()) return ok_status();
    // The step's one wait: the drafts, to the host.
    host_tokens_.resize(static_cast<size_t>(model_->draft_rows()));
    KILN_RETURN_IF_ERROR(s_.device().copy(host_tokens_.data(), model_->tokens(), host_tokens_.size() * sizeof(int32_t), true));
    const int64_t width = model_->walk_width();
    for (size_t d = 0; d < blocks_.size(); ++d) {
      DraftProposal& p = out[drafting_[d]];
      const int64_t first = model_->first_row(d);
      p.tokens.assign(host_tokens_.begin() + first, host_tokens_.begin() + first + blocks_[d].depth);
      if (blocks_[d].temperature > 0) {
        p.q_ids = model_->q_ids() + first * width;
        p.q_probs = model_->q_probs() + first * width;
        p.q_width = width;
      }
    }
    return ok_status();
  }

  // The context K/V is stored by position: rows past the target's length are rewritten before anything reads them.
  Status rollback(int64_t, int64_t) override { return ok_status(); }
  void release(int64_t seq_id) override { rngs_.erase(seq_id); }

 private:
  DraftServices& s_;
  std::unique_ptr<DflashCudaModel> model_;
  std::string name_;
  std::map<int64_t, std::mt19937_64> rngs_;
  std::vector<ContextRow> rows_;
  std::vector<DraftBlock> blocks_;
  std::vector<size_t> drafting_;
  std::vector<int32_t> host_tokens_;
};

}  // namespace

Result<std::unique_ptr<Drafter>> make_cuda_drafter(DraftServices& services, const WeightSource& source,
                                                   DflashConfig config, const DflashWeights& weights, KvDtype kv,
                                                   std::string name) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<DflashCudaModel> model,
                        DflashCudaModel::load(services, source, std::move(config), weights, kv));
  return std::unique_ptr<Drafter>(new DflashCudaDrafter(services, std::move(model), std::move(name)));
}

}  // namespace kiln::dflash
