// The `mtp` drafter: DeepSeek-style next-n (MTP) drafting with the target checkpoint's own MTP layer, which the
// engine runs for it on the target's device (DraftServices::mtp_run; the plugin sees only SDK headers). After every
// target step, per sequence:
//   step 1: the rows the target just computed, each conditioned on the target's final-normed hidden state h_p (the
//           step's tap, on the device) and the token t_{p+1} (the newest token for the last row), extend the MTP
//           layer's KV; the last row's logits give draft 1;
//   steps 2..K: one row each, on the previous step's MTP output hidden state and the previous draft.
// The MTP layer's KV shares the target's pages, so rows past the accepted ones are simply overwritten next time
// (from the target's real hidden states); a layer with recurrent state is rolled back by the engine's services,
// which tell step-1 rows (on the target's hidden states) from draft rows (on the layer's own output). Drafts are argmax at temperature 0, else sampled on the device from q =
// softmax(logits / T) over its kQWidth likeliest tokens, which is returned (sparse) for rejection sampling. Steps
// 2..K take the previous draft from the device (DraftServices::mtp_run_device_tokens), so the K steps run without a
// host synchronisation; only the draft ids cross to the host, once, after the last step.
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/draft_services.h"
#include "kiln/drafter.h"
#include "kiln/plugin.h"

namespace {

using kiln::Status;

constexpr int kMaxDepth = 16;     // the largest speculative.depth the core schema allows
constexpr int64_t kMtpLayer = 0;  // GLM and DeepSeek checkpoints carry one next-n layer, reused for every step
// Candidates kept in q: the draft distribution restricted to them is what drafts are drawn from, so verification
// stays exact; 64 hold nearly all of a trained MTP head's mass at sampling temperatures.
constexpr int64_t kQWidth = 64;

// The drafter's random stream must be independent of the target's acceptance draws, which are seeded with
// the same request seed: derive its seed through splitmix64 of a distinct offset.
uint64_t draft_seed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * 2;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class MtpDrafter final : public kiln::Drafter {
 public:
  explicit MtpDrafter(kiln::DraftServices& services)
      : services_(services), hidden_(services.hidden_size()), vocab_(services.vocab_size()) {}

  kiln::DrafterCapabilities capabilities() const override {
    kiln::DrafterCapabilities caps;
    caps.tap_layers = {kiln::kTapFinalNormed};
    caps.max_depth = kMaxDepth;
    caps.parallel_drafting = false;
    caps.has_draft_probs = true;
    caps.needs_target_mtp = true;
    return caps;
  }

  Status propose(const kiln::DraftStep& step, std::vector<kiln::DraftProposal>& out) override {
    const size_t B = step.seqs.size();
    out.assign(B, {});
    if (B == 0) return {};
    if (step.taps.size() != 1 || !step.taps[0].data)
      return kiln::invalid_argument("mtp drafter: needs the target's final-normed hidden states (one tap)");
    // Sequences that want drafts first, so their step-1 logits are the leading rows.
    std::vector<size_t> order(B);
    for (size_t b = 0; b < B; ++b) order[b] = b;
    std::stable_partition(order.begin(), order.end(), [&](size_t b) { return step.seqs[b].depth > 0; });
    size_t drafting = 0;
    int depth = 0;
    for (size_t b : order) {
      const kiln::DraftSequence& s = step.seqs[b];
      KILN_RETURN_IF_ERROR(check(s));
      if (s.depth > 0) ++drafting, depth = std::max(depth, s.depth);
    }

    // Step 1: every new row; row i pairs h at position start + i with the token one position later.
    const auto* taps = step.taps[0].as<const float>();
    std::vector<kiln::MtpRows> rows;
    for (size_t b : order) {
      const kiln::DraftSequence& s = step.seqs[b];
      rows.push_back({s.block_table, s.num_blocks, s.start_position, s.next_tokens, taps + s.tap_row * hidden_, 0,
                      s.num_rows, false});
    }
    kiln::MtpOutput mo;
    KILN_RETURN_IF_ERROR(services_.mtp_run(kMtpLayer, rows, mo).with_context("mtp drafter, step 1"));
    if (drafting == 0) return {};

    KILN_RETURN_IF_ERROR(ensure_buffers(static_cast<int64_t>(drafting), depth));
    // Per drafting sequence: the MTP output row that drafted its previous draft. Draft k of every drafting sequence
    // lands on the device at tokens_dev_ + (k − 1) · drafting, and step k + 1 reads it from there: the K steps are
    // enqueued back to back and the drafts cross to the host once, after the last.
    std::vector<const float*> prev_hidden(drafting);
    for (size_t i = 0, row = 0; i < B; row += step.seqs[order[i]].num_rows, ++i)
      if (i < drafting) prev_hidden[i] = mo.hidden + (row + step.seqs[order[i]].num_rows - 1) * hidden_;
    std::vector<float> temperatures(drafting);
    std::vector<double> uniforms(drafting);
    for (int k = 1; k <= depth; ++k) {
      int32_t* const drafts_k = tokens_dev_ + static_cast<int64_t>(k - 1) * static_cast<int64_t>(drafting);
      if (k > 1) {
        rows.clear();
        for (size_t i = 0; i < drafting; ++i) {
          const kiln::DraftSequence& s = step.seqs[order[i]];
          rows.push_back({s.block_table, s.num_blocks, s.start_position + s.num_rows + k - 2, nullptr, prev_hidden[i],
                          0, 1, false});
        }
        KILN_RETURN_IF_ERROR(services_.mtp_run_device_tokens(kMtpLayer, rows, drafts_k - drafting, mo)
                                 .with_context("mtp drafter, step " + std::to_string(k)));
        for (size_t i = 0; i < drafting; ++i) prev_hidden[i] = mo.hidden + i * hidden_;
      }
      // The drafting sequences' logits are rows 0 .. drafting − 1 (one row each, in `order`).
      for (size_t i = 0; i < drafting; ++i) {
        const kiln::DraftSequence& s = step.seqs[order[i]];
        temperatures[i] = s.temperature;
        uniforms[i] = s.temperature > 0 ? uniform(s) : 0.0;
      }
      kiln::DraftSampleRequest r;
      r.logits = mo.logits;
      r.rows = static_cast<int64_t>(drafting);
      r.temperatures = temperatures.data();
      r.uniforms = uniforms.data();
      r.q_width = kQWidth;
      r.tokens = drafts_k;
      r.q_ids = q_ids_ + (k - 1) * kQWidth;
      r.q_probs = q_probs_ + (k - 1) * kQWidth;
      r.q_row_stride = static_cast<int64_t>(max_depth_) * kQWidth;
      KILN_RETURN_IF_ERROR(services_.sample(r).with_context("mtp drafter, sampling draft " + std::to_string(k)));
    }
    // [depth, drafting] drafts, step-major.
    std::vector<int32_t> all(static_cast<size_t>(depth) * drafting);
    KILN_RETURN_IF_ERROR(services_.device().copy(all.data(), tokens_dev_, all.size() * sizeof(int32_t), true));
    std::vector<std::vector<int32_t>> drafts(drafting);
    for (int k = 0; k < depth; ++k)
      for (size_t i = 0; i < drafting; ++i) drafts[i].push_back(all[static_cast<size_t>(k) * drafting + i]);
    for (size_t i = 0; i < drafting; ++i) {
      const size_t b = order[i];
      const kiln::DraftSequence& s = step.seqs[b];
      out[b].tokens.assign(drafts[i].begin(), drafts[i].begin() + s.depth);
      if (s.temperature > 0) {
        out[b].q_ids = q_ids_ + i * max_depth_ * kQWidth;
        out[b].q_probs = q_probs_ + i * max_depth_ * kQWidth;
        out[b].q_width = kQWidth;
      }
    }
    return {};
  }

  // Its KV is the target's pages: rows past the target's length are overwritten before anything reads them.
  Status rollback(int64_t, int64_t) override { return {}; }
  void release(int64_t seq_id) override { rngs_.erase(seq_id); }

 private:
  Status check(const kiln::DraftSequence& s) const {
    const std::string who = "mtp drafter, sequence " + std::to_string(s.seq_id);
    if (s.num_rows < 1 || !s.next_tokens || !s.block_table)
      return kiln::invalid_argument(who + ": needs new target rows with their next tokens and a block table");
    for (int64_t i = 0; i < s.num_rows; ++i)
      if (s.next_tokens[i] < 0 || s.next_tokens[i] >= vocab_)
        return kiln::invalid_argument(who + ": token " + std::to_string(s.next_tokens[i]) +
                                      " is not a token id (vocabulary " + std::to_string(vocab_) + ")");
    if (s.depth < 0 || s.depth > kMaxDepth)
      return kiln::invalid_argument(who + ": depth " + std::to_string(s.depth) + " is outside 0.." +
                                    std::to_string(kMaxDepth));
    return {};
  }

  double uniform(const kiln::DraftSequence& s) {
    auto it = rngs_.find(s.seq_id);
    if (it == rngs_.end()) it = rngs_.emplace(s.seq_id, std::mt19937_64(draft_seed(s.seed))).first;
    return static_cast<double>(it->second() >> 11) * 0x1.0p-53;
  }

  // Device buffers for the drafts and their q, grown to the largest batch seen (device memory stays with the
  // model, so growth is by doubling).
  Status ensure_buffers(int64_t rows, int depth) {
    if (rows <= max_rows_ && depth <= max_depth_) return {};
    const int64_t r = std::max(rows, 2 * max_rows_);
    const int d = std::max(depth, max_depth_);
    KILN_ASSIGN_OR_RETURN(void* t, services_.device().allocate(static_cast<size_t>(r * d) * sizeof(int32_t), "mtp drafts"));
    KILN_ASSIGN_OR_RETURN(void* qi, services_.device().allocate(static_cast<size_t>(r * d * kQWidth) * 4, "mtp q ids"));
    KILN_ASSIGN_OR_RETURN(void* qp, services_.device().allocate(static_cast<size_t>(r * d * kQWidth) * 4, "mtp q"));
    tokens_dev_ = static_cast<int32_t*>(t);
    q_ids_ = static_cast<int32_t*>(qi);
    q_probs_ = static_cast<float*>(qp);
    max_rows_ = r;
    max_depth_ = d;
    return {};
  }

  kiln::DraftServices& services_;
  int64_t hidden_, vocab_;
  std::map<int64_t, std::mt19937_64> rngs_;
  int32_t* tokens_dev_ = nullptr;
  int32_t* q_ids_ = nullptr;
  float* q_probs_ = nullptr;
  int64_t max_rows_ = 0;
  int max_depth_ = 0;
};

kiln::Result<std::unique_ptr<kiln::Drafter>> make_mtp_drafter(const kiln::CreateContext& ctx) {
  if (!ctx.draft_services)
    return kiln::failed_precondition(
        "the `mtp` drafter runs the target checkpoint's next-n (MTP) layer and needs the engine's draft services; "
        "create it with the target model loaded with its MTP layers");
  if (ctx.draft_services->num_mtp_layers() < 1)
    return kiln::failed_precondition(
        "the `mtp` drafter needs the checkpoint's MTP layer (model.layers.<num_hidden_layers>.*), and this checkpoint "
        "has none; choose one with num_nextn_predict_layers ≥ 1 or set speculative.method = \"none\"");
  if (ctx.model && ctx.model->hidden_size != ctx.draft_services->hidden_size())
    return kiln::failed_precondition("the draft services' hidden size " +
                                     std::to_string(ctx.draft_services->hidden_size()) + " differs from the model's " +
                                     std::to_string(ctx.model->hidden_size));
  return std::unique_ptr<kiln::Drafter>(new MtpDrafter(*ctx.draft_services));
}

Status register_mtp(kiln::Registrar& registrar) {
  // No keys of its own: speculative.depth is a core key. The work runs wherever the target does.
  return registrar.add<kiln::Drafter>("mtp", "DeepSeek-style next-n drafting with the checkpoint's MTP layer",
                                      &make_mtp_drafter, kiln::DeviceSet::cpu_and_cuda());
}

}  // namespace

KILN_PLUGIN("draft-mtp", "0.2.0", "MTP drafter: the target checkpoint's next-n layer proposes K tokens", &register_mtp)
