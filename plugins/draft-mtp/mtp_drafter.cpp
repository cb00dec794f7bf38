// The `mtp` drafter: DeepSeek-style next-n (MTP) drafting with the target checkpoint's own MTP layer, which the
// engine runs for it through the DraftHost (the plugin sees only SDK headers). Per sequence and step:
//   step 1: the rows the target ran since the last step, each conditioned on the target's final-normed hidden
//           state h_p and the token t_{p+1} (the newest token for the last row), extend the MTP layer's KV;
//           the last row's logits give draft 1;
//   steps 2..K: one row each, on the previous step's MTP output hidden state and the previous draft.
// The recursive rows are dropped from the MTP KV when the step ends: next time they are recomputed from the
// target's real hidden states. Drafts are argmax at temperature 0, else sampled from q = softmax(logits / T),
// which is returned for the target's rejection sampling.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/drafter.h"
#include "kiln/plugin.h"

namespace {

using kiln::Status;

constexpr int kMaxDepth = 16;  // the largest speculative.depth the core schema allows
constexpr int64_t kMtpLayer = 0;  // GLM and DeepSeek checkpoints carry one next-n layer, reused for every step

// The drafter's random stream must be independent of the target's acceptance draws, which are seeded with
// the same request seed: derive its seed through splitmix64 of a distinct offset.
uint64_t draft_seed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * 2;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

// q = softmax(logits / T) into probs; returns a draw from it (u with 53 bits, first index whose running sum
// exceeds u).
int32_t sample_softmax(const float* logits, int64_t n, float temperature, std::mt19937_64& rng, float* probs) {
  const float m = logits[argmax(logits, n)];
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += probs[i] = std::exp((logits[i] - m) / temperature);
  for (int64_t i = 0; i < n; ++i) probs[i] = static_cast<float>(probs[i] / sum);
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  double run = 0;
  for (int64_t i = 0; i < n; ++i) {
    run += probs[i];
    if (run > u && probs[i] > 0) return static_cast<int32_t>(i);
  }
  return argmax(probs, n);  // u landed in the rounding slack above the last running sum
}

class MtpDrafter final : public kiln::Drafter {
 public:
  explicit MtpDrafter(kiln::DraftHost& host) : host_(host), hidden_(host.hidden_size()), vocab_(host.vocab_size()) {}
  ~MtpDrafter() override {
    for (auto& [id, s] : sequences_) host_.release(id);
  }

  kiln::DrafterCapabilities capabilities() const override {
    kiln::DrafterCapabilities caps;
    caps.target_hidden_layers = {-1};
    caps.max_depth = kMaxDepth;
    caps.parallel_drafting = false;
    caps.has_draft_probs = true;
    caps.needs_kv_rollback = true;
    return caps;
  }

  Status propose(const std::vector<kiln::DraftInput>& batch, int depth, std::vector<kiln::DraftOutput>& out) override {
    if (depth < 1 || depth > kMaxDepth)
      return kiln::invalid_argument("mtp drafter: depth " + std::to_string(depth) + " is outside 1.." +
                                    std::to_string(kMaxDepth));
    out.assign(batch.size(), {});
    if (batch.empty()) return {};
    std::vector<Sequence*> seqs;
    for (const kiln::DraftInput& in : batch) {
      auto s = prepare(in);
      if (!s.ok()) return s.status();
      seqs.push_back(*s);
    }

    // Step 1: every new row; row i pairs h at position start + i with the token one position later.
    std::vector<std::vector<int32_t>> shifted(batch.size());
    std::vector<kiln::DraftLayerRows> rows(batch.size());
    for (size_t b = 0; b < batch.size(); ++b) {
      const kiln::DraftInput& in = batch[b];
      shifted[b].assign(in.tokens + 1, in.tokens + in.num_tokens);
      shifted[b].push_back(in.next_token);
      rows[b] = {in.seq_id, in.start_position, shifted[b].data(), in.target_hidden, in.num_tokens, false};
    }
    kiln::DraftLayerOutput step;
    KILN_RETURN_IF_ERROR(host_.run(kMtpLayer, rows, step).with_context("mtp drafter, step 1"));
    for (size_t b = 0; b < batch.size(); ++b) seqs[b]->conditioned = batch[b].start_position + batch[b].num_tokens;

    // Per sequence: the previous draft and the MTP output hidden state of the row that drafted it.
    std::vector<int32_t> prev(batch.size());
    std::vector<float> prev_hidden(batch.size() * hidden_);
    auto take = [&](const kiln::DraftLayerOutput& o, const std::vector<int64_t>& last_row) {
      for (size_t b = 0; b < batch.size(); ++b) {
        prev[b] = choose(batch[b], *seqs[b], o.logits.data() + o.first_row[b] * vocab_, out[b]);
        std::copy_n(o.hidden.data() + last_row[b] * hidden_, hidden_, prev_hidden.data() + b * hidden_);
      }
    };
    std::vector<int64_t> last_row(batch.size());
    for (size_t b = 0, off = 0; b < batch.size(); off += batch[b].num_tokens, ++b)
      last_row[b] = static_cast<int64_t>(off) + batch[b].num_tokens - 1;
    take(step, last_row);

    Status status;
    for (int k = 2; k <= depth && status.ok(); ++k) {
      for (size_t b = 0; b < batch.size(); ++b) {
        rows[b] = {batch[b].seq_id, seqs[b]->conditioned + k - 2, &prev[b], prev_hidden.data() + b * hidden_, 1, false};
        last_row[b] = static_cast<int64_t>(b);
      }
      status = host_.run(kMtpLayer, rows, step).with_context("mtp drafter, step " + std::to_string(k));
      if (status.ok()) take(step, last_row);
    }
    // The recursive rows conditioned on drafts, not on the target: drop them whatever happened.
    for (size_t b = 0; b < batch.size(); ++b) {
      Status t = host_.truncate(batch[b].seq_id, seqs[b]->conditioned);
      if (status.ok()) status = t;
    }
    return status;
  }

  Status rollback(int64_t seq_id, int64_t length) override {
    auto it = sequences_.find(seq_id);
    if (it == sequences_.end()) return {};
    it->second.conditioned = std::min(it->second.conditioned, std::max<int64_t>(length, 0));
    return host_.truncate(seq_id, it->second.conditioned);
  }

  void release(int64_t seq_id) override {
    if (sequences_.erase(seq_id)) host_.release(seq_id);
  }

 private:
  struct Sequence {
    int64_t conditioned = 0;  // MTP positions computed from the target's own hidden states
    std::mt19937_64 rng;
  };

  kiln::Result<Sequence*> prepare(const kiln::DraftInput& in) {
    const std::string who = "mtp drafter, sequence " + std::to_string(in.seq_id);
    if (in.num_tokens < 1 || !in.tokens || !in.target_hidden)
      return kiln::invalid_argument(who + ": needs at least one new target row with its token and hidden state");
    if (in.next_token < 0 || in.next_token >= vocab_)
      return kiln::invalid_argument(who + ": next_token " + std::to_string(in.next_token) +
                                    " is not a token id (vocabulary " + std::to_string(vocab_) + ")");
    auto it = sequences_.find(in.seq_id);
    if (it == sequences_.end()) {
      KILN_RETURN_IF_ERROR(host_.allocate(in.seq_id));
      it = sequences_.emplace(in.seq_id, Sequence{0, std::mt19937_64(draft_seed(in.seed))}).first;
    }
    if (in.start_position > it->second.conditioned)
      return kiln::invalid_argument(who + " has drafter state for " + std::to_string(it->second.conditioned) +
                                    " positions; new rows cannot start at " + std::to_string(in.start_position));
    // Rows from start_position on are recomputed (after a rollback the engine may resend some).
    it->second.conditioned = in.start_position;
    return &it->second;
  }

  int32_t choose(const kiln::DraftInput& in, Sequence& s, const float* logits, kiln::DraftOutput& o) {
    if (in.temperature <= 0.0f) {
      o.tokens.push_back(argmax(logits, vocab_));
      return o.tokens.back();
    }
    o.probs.resize(o.probs.size() + vocab_);
    o.tokens.push_back(sample_softmax(logits, vocab_, in.temperature, s.rng, o.probs.data() + o.probs.size() - vocab_));
    return o.tokens.back();
  }

  kiln::DraftHost& host_;
  int64_t hidden_, vocab_;
  std::map<int64_t, Sequence> sequences_;
};

kiln::Result<std::unique_ptr<kiln::Drafter>> make_mtp_drafter(const kiln::CreateContext& ctx) {
  if (!ctx.draft_host)
    return kiln::failed_precondition(
        "the `mtp` drafter runs the target checkpoint's next-n (MTP) layer and needs the engine's draft host; "
        "create it with the target model loaded with its MTP layers");
  if (ctx.draft_host->num_draft_layers() < 1)
    return kiln::failed_precondition(
        "the `mtp` drafter needs the checkpoint's MTP layer (model.layers.<num_hidden_layers>.*), and this checkpoint "
        "has none; choose one with num_nextn_predict_layers ≥ 1 or set speculative.method = \"none\"");
  if (ctx.model && ctx.model->hidden_size != ctx.draft_host->hidden_size())
    return kiln::failed_precondition("the draft host's hidden size " + std::to_string(ctx.draft_host->hidden_size()) +
                                     " differs from the model's " + std::to_string(ctx.model->hidden_size));
  return std::unique_ptr<kiln::Drafter>(new MtpDrafter(*ctx.draft_host));
}

Status register_mtp(kiln::Registrar& registrar) {
  // No keys of its own: speculative.depth and draft_kv_dtype are core keys.
  return registrar.add<kiln::Drafter>("mtp", "DeepSeek-style next-n drafting with the checkpoint's MTP layer (CPU)",
                                      &make_mtp_drafter);
}

}  // namespace

KILN_PLUGIN("draft-mtp", "0.1.0", "MTP drafter: the target checkpoint's next-n layer proposes K tokens", &register_mtp)
