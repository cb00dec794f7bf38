// The `dflash` and `dflash2` drafters: block-diffusion drafting (../shared/specs/dflash2.md) with a checkpoint of
// their own (speculative.draft_model), conditioned on the target's tapped layer outputs. After every target step,
// per sequence (the contract in kiln/drafter.h):
//   1. the step's rows extend the drafter's context K/V: row p's tapped hidden states → fc → hidden_norm → each
//      layer's k/v projections, stored at position p in the drafter's paged cache (its own layers in the engine's
//      pool, addressed by the sequence's block table; rows past the accepted ones are rewritten by later steps, so
//      rollback has nothing to undo);
//   2. one forward of the block [t_L, MASK × K] at positions L .. L + K over that context proposes all K drafts
//      (dflash: argmax; dflash2: the candidate selector walk), K ≤ block_size − 1.
// At temperature > 0 drafts are drawn from q (dflash: softmax(logits / T) over the 64 likeliest tokens; dflash2:
// softmax(S / T) over the selector's candidates on the chosen predecessor's row), which goes to the engine's
// rejection sampling. This file is the host half (host arithmetic, DflashModel); on a CUDA device make() hands the
// checkpoint to the CUDA half (cuda/dflash_cuda_drafter.h), which runs the same forward on the device.
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dflash_config.h"
#include "dflash_drafter_common.h"
#include "dflash_model.h"
#include "dflash_weights.h"
#include "kiln/draft_services.h"
#include "kiln/drafter.h"
#include "kiln/plugin.h"
#if DFLASH2_WITH_CUDA
#include "cuda/dflash_cuda_drafter.h"
#endif

namespace {

using kiln::Status;
using namespace kiln::dflash;

class ServicesHead final : public TargetHead {
 public:
  explicit ServicesHead(kiln::DraftServices& s) : s_(s) {}
  Status embed(const int32_t* ids, int64_t n, float* out) override {
    return s_.embed(ids, n, kiln::TensorView::contiguous(out, kiln::DType::kF32, {n, s_.hidden_size()}, s_.device().device()));
  }
  Status lm_head(const float* hidden, int64_t n, float* logits) override {
    const kiln::TensorView h = kiln::TensorView::contiguous(const_cast<float*>(hidden), kiln::DType::kF32,
                                                            {n, s_.hidden_size()}, s_.device().device());
    return s_.lm_head(h, logits);
  }

 private:
  kiln::DraftServices& s_;
};

class DflashDrafter final : public kiln::Drafter {
 public:
  DflashDrafter(kiln::DraftServices& services, std::unique_ptr<DflashModel> model, std::string name)
      : services_(services), model_(std::move(model)), head_(services), name_(std::move(name)) {}

  kiln::DrafterCapabilities capabilities() const override { return capabilities_of(*model_); }

  static kiln::DrafterCapabilities capabilities_of(const DflashModel& m) {
    return dflash_capabilities(m.config(), m.kv_row_bytes());
  }

  Status propose(const kiln::DraftStep& step, std::vector<kiln::DraftProposal>& out) override {
    out.assign(step.seqs.size(), {});
    const DflashConfig& c = model_->config();
    if (step.taps.size() != c.target_layers.size())
      return kiln::invalid_argument(name_ + " drafter: " + std::to_string(step.taps.size()) + " taps given, it taps " +
                                    std::to_string(c.target_layers.size()) + " target layers");
    const int64_t H = services_.hidden_size();
    drafts_.resize(step.seqs.size());
    for (size_t b = 0; b < step.seqs.size(); ++b) {
      const kiln::DraftSequence& s = step.seqs[b];
      const std::string who = name_ + " drafter, sequence " + std::to_string(s.seq_id);
      if (s.num_rows < 1 || !s.next_tokens || !s.block_table)
        return kiln::invalid_argument(who + ": needs new target rows with their next tokens and a block table");
      SequenceCache cache;
      cache.block_table = s.block_table;
      cache.num_blocks = s.num_blocks;
      cache.block_size = services_.block_size();
      for (int64_t l = 0; l < c.layers; ++l) {
        cache.k.push_back(static_cast<uint8_t*>(services_.cache(l, 0)));
        cache.v.push_back(static_cast<uint8_t*>(services_.cache(l, 1)));
        if (!cache.k.back() || !cache.v.back())
          return kiln::failed_precondition(who + ": the engine lent no cache for the drafter's layer " + std::to_string(l));
      }
      std::vector<const float*> taps;
      for (const kiln::TensorView& t : step.taps) taps.push_back(t.as<const float>() + s.tap_row * H);
      KILN_RETURN_IF_ERROR(model_->append_context(taps, H, s.num_rows, s.start_position, cache).with_context(who));
      if (s.depth <= 0) continue;
      if (s.depth > c.block_size - 1)
        return kiln::invalid_argument(who + ": depth " + std::to_string(s.depth) + " exceeds block_size − 1 = " +
                                      std::to_string(c.block_size - 1) + " of " + c.path);
      const int32_t anchor = s.next_tokens[s.num_rows - 1];
      if (anchor < 0 || anchor >= c.vocab)
        return kiln::invalid_argument(who + ": token " + std::to_string(anchor) + " is not a token id");
      auto it = rngs_.find(s.seq_id);
      if (it == rngs_.end()) it = rngs_.emplace(s.seq_id, std::mt19937_64(draft_seed(s.seed))).first;
      KILN_RETURN_IF_ERROR(model_->draft(anchor, s.start_position + s.num_rows, s.depth, s.temperature, it->second,
                                         cache, head_, drafts_[b])
                               .with_context(who));
      out[b].tokens = drafts_[b].tokens;
      if (drafts_[b].q_width > 0) {
        out[b].q_ids = drafts_[b].q_ids.data();
        out[b].q_probs = drafts_[b].q_probs.data();
        out[b].q_width = drafts_[b].q_width;
      }
    }
    return {};
  }

  // The context K/V is stored by position: rows past the target's length are rewritten before anything reads them.
  Status rollback(int64_t, int64_t) override { return {}; }
  void release(int64_t seq_id) override { rngs_.erase(seq_id); }

 private:
  kiln::DraftServices& services_;
  std::unique_ptr<DflashModel> model_;
  ServicesHead head_;
  std::string name_;
  std::map<int64_t, std::mt19937_64> rngs_;
  std::vector<BlockDrafts> drafts_;  // q stays valid until the next propose()
};

kiln::Result<std::unique_ptr<kiln::Drafter>> make(const kiln::CreateContext& ctx, bool v2) {
  const std::string name = v2 ? "dflash2" : "dflash";
  if (!ctx.draft_services)
    return kiln::failed_precondition("the `" + name +
                                     "` drafter runs on the target's embedding, lm_head and tapped hidden states and "
                                     "needs the engine's draft services");
  kiln::DraftServices& s = *ctx.draft_services;
#if !DFLASH2_WITH_CUDA
  if (s.device().device().type != kiln::DeviceType::kCpu)
    return kiln::unimplemented("the `" + name + "` drafter was built without CUDA (KILN_WITH_CUDA off): it runs on the CPU");
#endif
  const std::string dir = s.draft_model_path();
  if (dir.empty())
    return kiln::failed_precondition("the `" + name +
                                     "` drafter loads a checkpoint of its own: set speculative.draft_model to a "
                                     "DFlash checkpoint directory (config.json + model.safetensors)");
  KILN_ASSIGN_OR_RETURN(DflashConfig config,
                        read_config(dir, v2, s.hidden_size(), s.vocab_size(), s.num_target_layers()));
  const std::string kv = ctx.section ? ctx.section->get_string("draft_kv_dtype", "bf16") : "bf16";
  const KvDtype dtype = kv == "fp8" ? KvDtype::kFp8 : KvDtype::kBf16;
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const kiln::WeightSource> source, s.open_checkpoint(dir));
  KILN_ASSIGN_OR_RETURN(DflashWeights weights, load_weights(*source, config, s.hidden_size(), dir + "/model.safetensors"));
#if DFLASH2_WITH_CUDA
  if (s.device().device().is_cuda()) return make_cuda_drafter(s, *source, std::move(config), weights, dtype, name);
#endif
  auto model = std::make_unique<DflashModel>(std::move(config), std::move(weights), s.hidden_size(), dtype);
  return std::unique_ptr<kiln::Drafter>(new DflashDrafter(s, std::move(model), name));
}

#if DFLASH2_WITH_CUDA
constexpr kiln::DeviceSet kDevices = kiln::DeviceSet::cpu_and_cuda();
#else
constexpr kiln::DeviceSet kDevices = kiln::DeviceSet::cpu();
#endif

kiln::Result<std::unique_ptr<kiln::Drafter>> make_dflash(const kiln::CreateContext& ctx) { return make(ctx, false); }
kiln::Result<std::unique_ptr<kiln::Drafter>> make_dflash2(const kiln::CreateContext& ctx) { return make(ctx, true); }

Status register_dflash(kiln::Registrar& registrar) {
  // No keys of their own: the checkpoint (speculative.draft_model), its cache dtype (speculative.draft_kv_dtype) and
  // K (speculative.depth) are core keys; block size, taps, window and selector come from the checkpoint.
  KILN_RETURN_IF_ERROR(registrar.add<kiln::Drafter>(
      "dflash", "DFlash block-diffusion drafting: one forward proposes K tokens (a checkpoint of its own)", &make_dflash,
      kDevices));
  return registrar.add<kiln::Drafter>(
      "dflash2", "DFlash2: block diffusion with dynamic convs and a candidate selector walk (a checkpoint of its own)",
      &make_dflash2, kDevices);
}

}  // namespace

KILN_PLUGIN("draft-dflash2", "0.1.0", "DFlash / DFlash2 block-diffusion drafters with their own checkpoint",
            &register_dflash)
